// GeoTransolver on the GPU (run by scripts/gpu_check.sh; skipped without
// CUDA): the ball-query kernel against the ATen reference path on the CPU,
// and the whole model on the GPU in fp32 against PhysicsNeMo's fixture.
#include "aero/model/ball_query.h"
#include "aero/model/geotransolver.h"
#include "aero/model/registry.h"
#include "core/device/device.h"
#include "core/io/safetensors.h"

#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <vector>

namespace slipstream::aero {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

using testing::relative_error;

TEST(BallQueryKernelTest, NearestWithinTheRadiusInIncreasingDistanceZeroPadded_CUDA) {
  SKIP_WITHOUT_CUDA();
  auto points = torch::zeros({1, 10, 3});
  points.select(2, 0).copy_(torch::arange(10, torch::kFloat).unsqueeze(0));
  const auto query = torch::tensor({{{2.4f, 0.f, 0.f}}});
  ASSERT_TRUE(uses_ball_query_kernel(points.cuda(), query.cuda(), 5));
  const auto r = ball_query(points.cuda(), query.cuda(), 1.5, 5);
  EXPECT_TRUE(torch::equal(r.indices.cpu()[0][0], torch::tensor({2, 3, 1, 0, 0}, torch::kLong)));
  EXPECT_TRUE(
      torch::equal(r.neighbors.cpu()[0][0].select(1, 0), torch::tensor({2.f, 3.f, 1.f, 0.f, 0.f})));
  // Ties go to the lower index, as the scan order gives them.
  const auto tie = torch::tensor({{{4.5f, 0.f, 0.f}}});
  const auto t = ball_query(points.cuda(), tie.cuda(), 1.0, 2);
  EXPECT_TRUE(torch::equal(t.indices.cpu()[0][0], torch::tensor({4, 5}, torch::kLong)));
}

// Random clouds, two batches, tiles of points that do not divide N, every
// kernel K, radii from a few neighbours to the whole domain: the same
// neighbours as the reference path, but for round-off at the radius or
// between near-equal distances.
TEST(BallQueryKernelTest, MatchesTheReferencePathOnRandomClouds_CUDA) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(11);
  const auto points = torch::rand({2, 3001, 3}) * torch::tensor({2.f, 1.f, 0.5f});
  const auto queries = torch::rand({2, 1777, 3}) * torch::tensor({2.f, 1.f, 0.5f});
  struct Case {
    double radius;
    int64_t k;
  };
  for (const Case c :
       {Case{0.05, 4}, Case{0.1, 16}, Case{0.3, 32}, Case{0.5, 64}, Case{5.0, 100}, Case{5.0, 1}}) {
    const auto want = ball_query(points, queries, c.radius, c.k);
    const auto got = ball_query(points.cuda(), queries.cuda(), c.radius, c.k);
    const auto gi = got.indices.cpu(), gp = got.neighbors.cpu();
    ASSERT_EQ(gi.sizes(), want.indices.sizes());
    ASSERT_EQ(gp.sizes(), want.neighbors.sizes());
    const double mismatched = gi.ne(want.indices).to(torch::kDouble).mean().item<double>();
    EXPECT_LE(mismatched, 1e-4) << "radius " << c.radius << " k " << c.k;
    // Where an index differs, the two neighbours are as far from the query
    // to round-off (or one is the padding beside a point on the radius).
    const auto q = queries.unsqueeze(2);
    const auto dg = (gp - q).norm(2, -1), dw = (want.neighbors - q).norm(2, -1);
    const auto differ = gi.ne(want.indices);
    const auto near = (dg - dw).abs().le(1e-5) | (dg - c.radius).abs().le(1e-5) |
                      (dw - c.radius).abs().le(1e-5) | gp.eq(0).all(-1) |
                      want.neighbors.eq(0).all(-1);
    EXPECT_TRUE((near | differ.logical_not()).all().item<bool>())
        << "radius " << c.radius << " k " << c.k;
    // The neighbours are the points the indices name.
    const auto gathered = at::gather(points.unsqueeze(1).expand({2, 1777, 3001, 3}), 2,
                                     gi.unsqueeze(-1).expand({2, 1777, c.k, 3}));
    const auto padded = gp.eq(0).all(-1, true);
    EXPECT_TRUE(torch::where(padded, torch::zeros_like(gp), gathered)
                    .equal(torch::where(padded, torch::zeros_like(gp), gp)));
  }
}

TEST(GeoTransolverCudaTest, ReproducesPhysicsNeMoOnTheGpuInFp32_CUDA) {
  SKIP_WITHOUT_CUDA();
  for (const char* name :
       {"geotransolver_small_volume.safetensors", "geotransolver_small_surface.safetensors"}) {
    const auto f = read_safetensors(testing::fixtures_dir() + "/" + name);
    // The fixture's config holds PhysicsNeMo's constructor arguments.
    const auto model = build_model_from_physicsnemo(
        "GeoTransolver", nlohmann::json::parse(f.metadata.at("config")), name);
    std::map<std::string, torch::Tensor> named(f.tensors.begin(), f.tensors.end());
    model->load_named(named, "param.");
    model->to(torch::kCUDA);
    torch::NoGradGuard no_grad;
    ModelInputs inputs;
    for (const char* in : {"local_embedding", "geometry", "local_positions", "global_embedding"}) {
      inputs[in] = f.at(std::string("input.") + in).cuda();
    }
    const auto out = model->forward(inputs);
    EXPECT_LT(relative_error(out.cpu(), f.at("output")), 1e-4) << name;
  }
}

}  // namespace
}  // namespace slipstream::aero
