// The synthetic data is physics; sample files round-trip; bad files fail
// with messages that name them; the loader prefetches in order and rethrows
// worker errors on the caller's thread.
#include "aero/data/dataset.h"
#include "aero/data/loader.h"
#include "core/io/safetensors.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <set>

namespace slipstream::aero {
namespace {

const std::vector<std::string> kTargets{"velocity", "pressure", "nut"};

using testing::error_message_of;

TEST(SyntheticTest, PotentialFlowHasNoNormalVelocityOnTheSphereAndFreeStreamFarAway) {
  auto u = torch::tensor({1.0, 0.3, -0.2}, torch::kDouble);
  const double a = 0.8;
  auto dirs = torch::randn({100, 3}, torch::kDouble);
  dirs = dirs / dirs.norm(2, 1, true);
  auto on_surface = sphere_potential_flow_velocity(dirs * a, a, u);
  EXPECT_LT((on_surface * dirs).sum(1).abs().max().item<double>(), 1e-12);
  auto far = sphere_potential_flow_velocity(dirs * 1e4, a, u);
  EXPECT_LT((far - u.view({1, 3})).abs().max().item<double>(), 1e-9);
  // Divergence-free: central differences at a point off the body.
  auto x = torch::tensor({1.3, 0.4, -0.7}, torch::kDouble);
  double div = 0;
  const double h = 1e-5;
  for (int k = 0; k < 3; ++k) {
    auto e = torch::zeros({3}, torch::kDouble);
    e[k] = h;
    div += (sphere_potential_flow_velocity((x + e).view({1, 3}), a, u)[0][k] -
            sphere_potential_flow_velocity((x - e).view({1, 3}), a, u)[0][k])
               .item<double>() /
           (2 * h);
  }
  EXPECT_NEAR(div, 0.0, 1e-6);
}

TEST(SyntheticTest, DeterministicFromTheSeedAndConsistent) {
  SyntheticOptions o;
  o.points_per_sample = 500;
  auto a = make_synthetic_sample(3, o), b = make_synthetic_sample(3, o), c = make_synthetic_sample(4, o);
  EXPECT_TRUE(torch::equal(a.points, b.points));
  EXPECT_TRUE(torch::equal(a.targets["pressure"], b.targets["pressure"]));
  EXPECT_FALSE(torch::equal(a.points, c.points));
  validate_sample(a, kTargets);
  EXPECT_GT(a.sdf.min().item<double>(), 0.0);  // every point outside the body
  EXPECT_NEAR((a.sdf_normals.norm(2, 1) - 1).abs().max().item<double>(), 0.0, 1e-5);
  // Bernoulli: p + |u|^2/2 is the same everywhere.
  auto head = a.targets["pressure"].squeeze(1) + 0.5 * a.targets["velocity"].pow(2).sum(1);
  EXPECT_LT((head - head[0]).abs().max().item<double>(), 1e-4);
}

TEST(DirectoryDatasetTest, RoundTripAndBadFilesNameTheFile) {
  testing::TempDir dir;
  SyntheticOptions o;
  o.points_per_sample = 300;
  write_synthetic_directory(dir.path(), o, 3, 1);
  auto splits = open_sample_directory(dir.path(), kTargets);
  EXPECT_EQ(splits.train->size(), 3u);
  EXPECT_EQ(splits.val->size(), 1u);
  auto s = splits.train->get(1);
  EXPECT_TRUE(torch::equal(s.points, make_synthetic_sample(1, o).points));

  // Missing directory.
  EXPECT_NE(error_message_of([&] { open_sample_directory(dir.file("nope"), kTargets); }).find("nope"),
            std::string::npos);
  // Truncated sample.
  const std::string f0 = dir.file("sample_00000.safetensors");
  std::filesystem::resize_file(f0, std::filesystem::file_size(f0) / 2);
  EXPECT_NE(error_message_of([&] { splits.train->get(0); }).find(f0), std::string::npos);
  // Empty sample.
  std::ofstream(f0, std::ios::trunc).close();
  EXPECT_NE(error_message_of([&] { splits.train->get(0); }).find(f0), std::string::npos);
  // NaN coordinates.
  Sample bad = make_synthetic_sample(2, o);
  bad.points[5][1] = NAN;
  const std::string f2 = dir.file("sample_00002.safetensors");
  write_sample_file(f2, bad);
  const auto msg = error_message_of([&] { splits.train->get(2); });
  EXPECT_NE(msg.find(f2), std::string::npos) << msg;
  EXPECT_NE(msg.find("non-finite"), std::string::npos) << msg;
  // A sample missing a target field.
  const Sample good = make_synthetic_sample(2, o);
  write_safetensors(f2, {{"points", good.points}, {"sdf", good.sdf},
                         {"sdf_normals", good.sdf_normals}, {"U_inf", good.u_inf}});
  EXPECT_NE(error_message_of([&] { splits.train->get(2); }).find("velocity"), std::string::npos);
}

TEST(SamplerTest, ShardsAreDisjointAndTheSameLengthOnEveryRank) {
  std::set<size_t> seen;
  for (int rank = 0; rank < 3; ++rank) {
    auto o = epoch_order(10, 2, 7, true, rank, 3, /*drop_last=*/true);
    EXPECT_EQ(o.size(), 3u);
    for (auto i : o) EXPECT_TRUE(seen.insert(i).second);
  }
  EXPECT_EQ(epoch_order(10, 2, 7, false, 0, 3, false).size(), 4u);
  EXPECT_NE(epoch_order(50, 1, 7, true, 0, 1, true), epoch_order(50, 2, 7, true, 0, 1, true));
}

struct FailingDataset : Dataset {
  size_t size() const override { return 6; }
  Sample get(size_t i) const override {
    if (i == 3) throw std::runtime_error("sample 3 is corrupt");
    SyntheticOptions o;
    o.points_per_sample = 64;
    return make_synthetic_sample(static_cast<int64_t>(i), o);
  }
  std::string describe() const override { return "failing"; }
};

TEST(PrefetchLoaderTest, DeliversInOrderAndRethrowsWorkerErrorsInOrder) {
  auto ds = std::make_shared<FailingDataset>();
  LoaderOptions o;
  o.sampling_resolution = 32;
  PrefetchLoader loader(ds, {0, 1, 2, 3, 4}, o, 1);
  for (size_t i = 0; i < 3; ++i) {
    auto b = loader.next();
    EXPECT_EQ(b.sample_index, i);
    EXPECT_EQ(b.embedding.sizes(), (std::vector<int64_t>{1, 32, 7}));
    EXPECT_EQ(b.fx.sizes(), (std::vector<int64_t>{1, 32, 3}));
    EXPECT_EQ(b.target.sizes(), (std::vector<int64_t>{1, 32, 5}));
  }
  try {
    loader.next();
    FAIL() << "the worker's error must reach the caller";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "sample 3 is corrupt");
  }
}

TEST(PrefetchLoaderTest, SubsampleIsDeterministicAndTargetsLineUpWithPoints) {
  SyntheticOptions so;
  so.points_per_sample = 1000;
  auto s = make_synthetic_sample(0, so);
  LoaderOptions o;
  o.sampling_resolution = 100;
  auto a = make_host_batch(s, o, 42), b = make_host_batch(s, o, 42);
  EXPECT_TRUE(torch::equal(a.embedding, b.embedding));
  // Each row's target belongs to that row's point.
  auto p = a.embedding[0].narrow(1, 0, 3);
  for (int64_t i = 0; i < 5; ++i) {
    auto row = (s.points - p[i]).abs().sum(1).argmin().item<int64_t>();
    EXPECT_TRUE(torch::equal(a.target[0][i].narrow(0, 0, 3), s.targets["velocity"][row]));
  }
}

}  // namespace
}  // namespace slipstream::aero
