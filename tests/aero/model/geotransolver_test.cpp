// GeoTransolver against PhysicsNeMo's own: the volume and surface configs'
// parameter names, shapes and order; the small fixtures' outputs and every
// gradient (fp32, CPU); the ball query's neighbours; and the ball query's
// semantics and errors.
#include "aero/model/geotransolver/geotransolver.h"
#include "aero/ops/ball_query.h"
#include "core/io/safetensors.h"
#include "support/recipe_support.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <string>

namespace slipstream::aero {
namespace {

using testing::error_message_of;
using testing::relative_error;

GeoTransolverOptions volume_options() { return GeoTransolverOptions{}; }

GeoTransolverOptions surface_options() {
  GeoTransolverOptions o;
  o.functional_dim = 6;
  o.out_dim = 4;
  o.include_local_features = false;
  return o;
}

TEST(GeoTransolverTest, VolumeConfigMatchesPhysicsNeMosParametersLineByLine) {
  GeoTransolver model(volume_options());
  EXPECT_EQ(model->parameter_count(), 27574449);
  testing::expect_parameters_as_listed(*model, "geotransolver_volume_params.txt");
}

TEST(GeoTransolverTest, SurfaceConfigMatchesPhysicsNeMosParametersLineByLine) {
  GeoTransolver model(surface_options());
  EXPECT_EQ(model->parameter_count(), 9046016);
  testing::expect_parameters_as_listed(*model, "geotransolver_surface_params.txt");
}

struct Run {
  torch::Tensor out;
  std::map<std::string, torch::Tensor> grads;
};

// The fixture's model forward and backward (loss = mean(out^2)) in `dtype`.
Run run_fixture(const SafetensorsFile& f, torch::ScalarType dtype) {
  GeoTransolver model = testing::fixture_geotransolver(f);
  model->to(dtype);
  auto in = [&](const char* k) { return f.at(k).to(dtype); };
  Run r;
  r.out = model->forward(in("input.local_embedding"), in("input.geometry"),
                         in("input.local_positions"), in("input.global_embedding"));
  r.out.pow(2).mean().backward();
  for (const auto& p : model->named_parameters())
    r.grads[p.key()] = p.value().grad().to(torch::kFloat);
  r.out = r.out.to(torch::kFloat);
  return r;
}

// Every gradient within 1e-4 of PhysicsNeMo's (relative), except where the
// reference itself is not that close to the exact value: a few gradients of
// 1e-5 made of sums that cancel, where even fp64 arithmetic lands ~1.5e-4
// from PhysicsNeMo's fp32 numbers (then ours must be as close as fp64's),
// and the key biases, whose exact gradient is 0 (softmax ignores a shift
// common to a row): there both are round-off, 1e-9.
void expect_reproduces(const std::string& fixture) {
  const auto f = read_safetensors(testing::fixtures_dir() + "/" + fixture);
  const Run ours = run_fixture(f, torch::kFloat), exact = run_fixture(f, torch::kDouble);
  EXPECT_LT(relative_error(ours.out, f.at("output")), 1e-5) << fixture;
  double largest = 0;
  for (const auto& [name, g] : ours.grads) largest = std::max(largest, g.norm().item<double>());
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, g] : ours.grads) {
    const auto& want = f.at("grad." + name);
    const double err = relative_error(g, want);
    const double exact_err = relative_error(exact.grads.at(name), want);
    const double abs_err = (g - want).norm().item<double>();
    // An exact zero: the reference is round-off, far below every other gradient.
    const bool zero = want.norm().item<double>() < 1e-7 * largest && abs_err < 1e-7 * largest;
    const bool ok = err <= 1e-4 || err <= 1.5 * exact_err || zero;
    EXPECT_TRUE(ok) << fixture << " grad " << name << ": relative error " << err
                    << " (fp64 vs the fixture: " << exact_err << "), absolute " << abs_err;
    if (err > worst && !zero) worst = err, worst_name = name;
  }
  std::printf("%s: largest gradient norm %.3e; largest relative error %.2e (%s)\n", fixture.c_str(),
              largest, worst, worst_name.c_str());
}

TEST(GeoTransolverTest, ReproducesPhysicsNeMoVolumeOutputAndEveryGradient) {
  expect_reproduces("geotransolver_small_volume.safetensors");
}

TEST(GeoTransolverTest, ReproducesPhysicsNeMoSurfaceOutputAndEveryGradient) {
  expect_reproduces("geotransolver_small_surface.safetensors");
}

TEST(GeoTransolverTest, OneTensorForGeometryAndPositionsGivesTheSameResult) {
  const auto f =
      read_safetensors(testing::fixtures_dir() + "/geotransolver_small_volume.safetensors");
  GeoTransolver model = testing::fixture_geotransolver(f);
  torch::NoGradGuard no_grad;
  const auto& points = f.at("input.geometry");
  const auto shared =
      model->forward(f.at("input.local_embedding"), points, points, f.at("input.global_embedding"));
  EXPECT_LT(relative_error(shared, f.at("output")), 1e-4);
}

// One GALE layer's output and every gradient (x, the context and each
// parameter) for a fixed upstream gradient.
struct GaleStep {
  torch::Tensor out;
  std::map<std::string, torch::Tensor> grads;
};

GaleStep gale_step(GaleAttention& a, const torch::Tensor& x_in, const torch::Tensor& context_in,
                   const torch::Tensor& upstream) {
  a->zero_grad();
  auto x = x_in.detach().clone().requires_grad_(true);
  auto context =
      context_in.defined() ? context_in.detach().clone().requires_grad_(true) : torch::Tensor();
  GaleStep r;
  r.out = a->forward(x, context);
  (r.out * upstream).sum().backward();
  r.grads["x"] = x.grad();
  if (context.defined()) r.grads["context"] = context.grad();
  for (const auto& p : a->named_parameters()) {
    if (p.value().grad().defined()) r.grads[p.key()] = p.value().grad().clone();
  }
  return r;
}

// The fused GALE path (on the CPU: the slice kernels' ATen decomposition)
// against the plain one in fp64, with heads of 18 padded to the kernels'
// 32: the same output and gradients to fp64 round-off, for both mixing
// modes and without a context.
TEST(GeoTransolverTest, FusedGaleWithPaddedHeadsEqualsThePlainPath) {
  struct Case {
    const char* mode;
    bool context;
  };
  for (const Case c :
       {Case{"weighted", true}, Case{"concat_project", true}, Case{"weighted", false}}) {
    torch::manual_seed(3);
    GaleAttention a(36, 2, 16, 20, c.mode);
    {
      torch::NoGradGuard no_grad;
      if (a->state_mixing.defined()) a->state_mixing.fill_(0.4);
      a->temperature.copy_(torch::tensor({0.7, 1.3}).view({1, 1, 2, 1}));
    }
    a->to(torch::kDouble);
    const auto x = torch::randn({2, 50, 36}, torch::kDouble);
    const auto context = c.context ? torch::randn({2, 2, 16, 20}, torch::kDouble) : torch::Tensor();
    const auto upstream = torch::randn({2, 50, 36}, torch::kDouble);
    a->fused = false;
    const auto plain = gale_step(a, x, context, upstream);
    a->fused = true;
    a->force_fused = true;
    ASSERT_TRUE(a->uses_fused(x));
    const auto fused = gale_step(a, x, context, upstream);
    EXPECT_LT(relative_error(fused.out, plain.out), 1e-12) << c.mode;
    EXPECT_EQ(fused.grads.size(), plain.grads.size()) << c.mode;
    double largest = 0;
    for (const auto& [name, want] : plain.grads) {
      largest = std::max(largest, want.norm().item<double>());
    }
    // cross_k.bias's gradient is zero but for round-off (a key bias shifts
    // every logit of a query alike): it is measured against the largest.
    for (const auto& [name, want] : plain.grads) {
      ASSERT_TRUE(fused.grads.count(name)) << c.mode << " " << name;
      const double err = (fused.grads.at(name) - want).norm().item<double>();
      EXPECT_LT(err, 1e-10 * std::max(want.norm().item<double>(), 1e-3 * largest))
          << c.mode << " " << name;
    }
  }
}

// The fused context projector (slice tokens alone) against the plain one in
// fp64: the same tokens and gradients (x and every parameter).
TEST(GeoTransolverTest, FusedContextProjectorEqualsThePlainPath) {
  torch::manual_seed(4);
  ContextProjector p(5, 2, 8, 16);
  {
    torch::NoGradGuard no_grad;
    p->temperature.copy_(torch::tensor({0.6, 2.0}).view({1, 1, 2, 1}));
  }
  p->to(torch::kDouble);
  const auto x = torch::randn({2, 70, 5}, torch::kDouble);
  const auto upstream = torch::randn({2, 2, 16, 8}, torch::kDouble);
  const auto run = [&](bool fused) {
    p->force_fused = fused;
    p->fused = fused;
    p->zero_grad();
    auto xg = x.clone().requires_grad_(true);
    const auto tokens = p->forward(xg);
    (tokens * upstream).sum().backward();
    std::map<std::string, torch::Tensor> g{{"tokens", tokens.detach()}, {"x", xg.grad()}};
    for (const auto& q : p->named_parameters()) g[q.key()] = q.value().grad().clone();
    return g;
  };
  const auto plain = run(false);
  const auto fused = run(true);
  for (const auto& [name, want] : plain) {
    EXPECT_LT(relative_error(fused.at(name), want), 1e-10) << name;
  }
}

// Chunked inference is exact: for every chunk size (1 point, sizes that do
// not divide N, more than N) the two-pass forward equals the whole forward
// to fp32 round-off, with PhysicsNeMo's weights and inputs, for geometry and
// positions as one tensor and as two.
TEST(GeoTransolverTest, ChunkedForwardEqualsTheWholeForwardForAnyChunk) {
  for (const char* name :
       {"geotransolver_small_volume.safetensors", "geotransolver_small_surface.safetensors"}) {
    const auto f = read_safetensors(testing::fixtures_dir() + "/" + name);
    GeoTransolver model = testing::fixture_geotransolver(f);
    ASSERT_TRUE(model->exact_in_chunks());
    torch::NoGradGuard no_grad;
    const auto points = f.at("input.geometry");
    for (const bool one_tensor : {true, false}) {
      const ModelInputs inputs{
          {"local_embedding", f.at("input.local_embedding")},
          {"geometry", points},
          {"local_positions", one_tensor ? points : f.at("input.local_positions")},
          {"global_embedding", f.at("input.global_embedding")}};
      const auto whole = model->forward(inputs);
      const int64_t n = whole.size(1);
      // Chunks of one point once (each runs every op: slow on many threads).
      std::vector<int64_t> chunks{7, 64, n - 1, 2 * n};
      if (one_tensor && std::string(name).find("volume") != std::string::npos) chunks.push_back(1);
      for (const int64_t chunk : chunks) {
        const auto chunked = model->forward_in_chunks(inputs, chunk);
        ASSERT_EQ(chunked.sizes(), whole.sizes()) << name << " chunk " << chunk;
        EXPECT_LT(relative_error(chunked, whole), 1e-5)
            << name << " chunk " << chunk << (one_tensor ? " one tensor" : " two tensors");
      }
    }
    // Twenty points alone are not a chunk of twenty: each sees all the others.
    const auto few = points.narrow(1, 0, 20);
    const auto alone =
        model->forward({{"local_embedding", f.at("input.local_embedding").narrow(1, 0, 20)},
                        {"geometry", few},
                        {"local_positions", few},
                        {"global_embedding", f.at("input.global_embedding")}});
    const auto whole = model->forward({{"local_embedding", f.at("input.local_embedding")},
                                       {"geometry", points},
                                       {"local_positions", points},
                                       {"global_embedding", f.at("input.global_embedding")}});
    EXPECT_GT(relative_error(alone, whole.narrow(1, 0, 20)), 1e-3) << name;
  }
}

// training.recompute for GeoTransolver: the loss and every gradient are
// those of the run that keeps everything, with the context (every GALE's
// side input) and without local features. Whole sub-blocks give the loss
// bitwise on the CPU, and the gradients to fp32 round-off (not bitwise: the
// context's gradient is summed over the blocks in another order); the MLPs
// in chunks of points, both to round-off.
// model.mlp_keep_gelu_layers: the MLPs that keep gelu(h) give the same loss
// and gradients as recomputing it, bitwise on the CPU (the same ops); a
// count outside [0, n_layers] is an error naming the option.
TEST(GeoTransolverTest, KeepingGeluOutputsGivesTheSameLossAndGradients) {
  const auto f =
      read_safetensors(testing::fixtures_dir() + "/geotransolver_small_volume.safetensors");
  const auto points = f.at("input.geometry");
  auto options = testing::fixture_geotransolver_options(f);
  ASSERT_TRUE(options.mlp_recompute_gelu);
  std::vector<std::map<std::string, torch::Tensor>> grads;
  std::vector<double> losses;
  for (const int64_t keep : {int64_t{0}, options.n_layers}) {
    options.mlp_keep_gelu_layers = keep;
    GeoTransolver model(options);
    std::map<std::string, torch::Tensor> named(f.tensors.begin(), f.tensors.end());
    model->load_named(named, "param.");
    auto l =
        model
            ->forward(f.at("input.local_embedding"), points, points, f.at("input.global_embedding"))
            .pow(2)
            .mean();
    l.backward();
    losses.push_back(l.item<double>());
    grads.emplace_back();
    for (const auto& p : model->named_parameters()) grads.back()[p.key()] = p.value().grad();
  }
  EXPECT_EQ(losses[0], losses[1]);
  for (const auto& [key, g] : grads[0]) EXPECT_TRUE(torch::equal(g, grads[1].at(key))) << key;
  options.mlp_keep_gelu_layers = options.n_layers + 1;
  const auto msg = testing::error_message_of([&] { GeoTransolver bad(options); });
  EXPECT_NE(msg.find("mlp_keep_gelu_layers"), std::string::npos) << msg;
}

TEST(GeoTransolverTest, RecomputeGivesTheSameLossAndGradients) {
  for (const char* name :
       {"geotransolver_small_volume.safetensors", "geotransolver_small_surface.safetensors"}) {
    const auto f = read_safetensors(testing::fixtures_dir() + "/" + name);
    const auto points = f.at("input.geometry");
    auto run = [&](RecomputeOptions r, double& loss, std::map<std::string, torch::Tensor>& grads) {
      GeoTransolver model = testing::fixture_geotransolver(f);
      model->set_recompute(r);
      auto l = model
                   ->forward(f.at("input.local_embedding"), points, points,
                             f.at("input.global_embedding"))
                   .pow(2)
                   .mean();
      l.backward();
      loss = l.item<double>();
      for (const auto& p : model->named_parameters()) grads[p.key()] = p.value().grad();
    };
    double base_loss = 0;
    std::map<std::string, torch::Tensor> base;
    run({}, base_loss, base);
    double largest = 0;
    for (const auto& [key, g] : base) largest = std::max(largest, g.norm().item<double>());
    for (const auto& r :
         {RecomputeOptions{Recompute::kAttention, 0}, RecomputeOptions{Recompute::kBlock, 0},
          RecomputeOptions{Recompute::kBlock, 37}}) {
      double loss = 0;
      std::map<std::string, torch::Tensor> grads;
      run(r, loss, grads);
      const std::string what =
          std::string(name) + ", " + to_string(r.mode) + ", chunk " + std::to_string(r.point_chunk);
      ASSERT_EQ(grads.size(), base.size()) << what;
      if (r.point_chunk == 0) {
        EXPECT_EQ(loss, base_loss) << what;
      } else {
        EXPECT_NEAR(loss, base_loss, 1e-6 * std::abs(base_loss)) << what;
      }
      double worst = 0;
      for (const auto& [key, g] : base) {
        ASSERT_TRUE(grads.at(key).defined()) << what << " " << key;
        // Relative, but to no less than 1e-3 of the largest gradient: the
        // slice biases' gradients are sums that cancel to ~1e-4 of their
        // terms (softmax ignores a shift common to a row), and the key
        // biases' are round-off of an exact zero.
        const double err = (grads.at(key) - g).norm().item<double>() /
                           std::max(g.norm().item<double>(), 1e-3 * largest);
        worst = std::max(worst, err);
        EXPECT_LT(err, 2e-5) << what << " " << key;
      }
      std::printf("recompute %s: largest gradient relative error %.2e\n", what.c_str(), worst);
    }
  }
}

TEST(BallQueryTest, ReproducesPhysicsNeMosNeighboursExactly) {
  const auto f =
      read_safetensors(testing::fixtures_dir() + "/geotransolver_small_volume.safetensors");
  // Scale 0 (radius 0.2, 4 neighbours): geometry queried at local_positions.
  const auto r = ball_query(f.at("input.geometry"), f.at("input.local_positions"), 0.2, 4);
  EXPECT_TRUE(torch::equal(r.neighbors, f.at("check.neighbors_scale0")));
}

TEST(BallQueryTest, NearestWithinTheRadiusInIncreasingDistanceZeroPadded) {
  // Points on a line at 0, 1, 2, ..., 9; the query at 2.4.
  auto points = torch::zeros({1, 10, 3});
  points.select(2, 0).copy_(torch::arange(10, torch::kFloat).unsqueeze(0));
  auto query = torch::tensor({{{2.4f, 0.f, 0.f}}});
  const auto r = ball_query(points, query, 1.5, 5);
  // Distances 0.4, 0.6, 1.4; the rest lie outside the radius.
  EXPECT_TRUE(torch::equal(r.indices[0][0], torch::tensor({2, 3, 1, 0, 0}, torch::kLong)));
  EXPECT_TRUE(
      torch::equal(r.neighbors[0][0].select(1, 0), torch::tensor({2.f, 3.f, 1.f, 0.f, 0.f})));
  EXPECT_EQ(r.neighbors.sizes(), (std::vector<int64_t>{1, 1, 5, 3}));
  // Chunked queries give the same answer as one block.
  const auto many = torch::rand({1, 37, 3}) * 9;
  const auto whole = ball_query(points, many, 2.0, 4);
  const auto chunked = ball_query(points, many, 2.0, 4, /*max_elements=*/30);
  EXPECT_TRUE(torch::equal(whole.indices, chunked.indices));
  EXPECT_TRUE(torch::equal(whole.neighbors, chunked.neighbors));
}

// Several scales from one search equal one ball query per scale: the
// prefix within each radius of the largest K nearest within the largest.
TEST(BallQueryTest, ScalesFromOneSearchEqualOneQueryPerScale) {
  torch::manual_seed(5);
  const auto points = torch::rand({2, 300, 3}) * torch::tensor({2.f, 1.f, 0.5f});
  const auto queries = torch::rand({2, 41, 3}) * 2;
  const std::vector<BallQueryScale> scales{{0.05, 8}, {0.2, 16}, {0.6, 32}, {5.0, 4}, {0.3, 64}};
  const auto all = ball_query_scales(points, queries, scales, /*max_elements=*/5000);
  ASSERT_EQ(all.size(), scales.size());
  int64_t padded = 0;
  for (size_t i = 0; i < scales.size(); ++i) {
    const auto one = ball_query(points, queries, scales[i].radius, scales[i].k);
    EXPECT_TRUE(torch::equal(all[i].indices, one.indices)) << "scale " << i;
    EXPECT_TRUE(torch::equal(all[i].neighbors, one.neighbors)) << "scale " << i;
    padded += one.neighbors.eq(0).all(-1).sum().item<int64_t>();
  }
  EXPECT_GT(padded, 0);  // some scales run out of points within their radius
  EXPECT_NE(error_message_of([&] { ball_query_scales(points, queries, {}); }).find("no scales"),
            std::string::npos);
}

// A BallQueryIndex (on the CPU: the points, for the reference path) queried
// chunk by chunk gives the whole search's neighbours.
TEST(BallQueryTest, AnIndexQueriedByChunksGivesTheWholeSearch) {
  torch::manual_seed(3);
  const auto points = torch::rand({2, 300, 3}), queries = torch::rand({2, 101, 3});
  const std::vector<BallQueryScale> scales{{0.1, 4}, {0.3, 16}};
  const auto whole = ball_query_scales(points, queries, scales);
  const BallQueryIndex index(points);
  std::vector<std::vector<torch::Tensor>> idx(scales.size()), nbr(scales.size());
  for (int64_t s = 0; s < 101; s += 37) {
    const auto part = index.query(queries.narrow(1, s, std::min<int64_t>(37, 101 - s)), scales);
    for (size_t i = 0; i < scales.size(); ++i) {
      idx[i].push_back(part[i].indices);
      nbr[i].push_back(part[i].neighbors);
    }
  }
  for (size_t i = 0; i < scales.size(); ++i) {
    EXPECT_TRUE(torch::equal(torch::cat(idx[i], 1), whole[i].indices)) << i;
    EXPECT_TRUE(torch::equal(torch::cat(nbr[i], 1), whole[i].neighbors)) << i;
  }
  EXPECT_GT((whole[1].indices != 0).sum().item<int64_t>(), 0);
  const auto msg = testing::error_message_of([&] { index.query(queries, {{0.1, 301}}); });
  EXPECT_NE(msg.find("301 neighbours"), std::string::npos) << msg;
}

TEST(BallQueryTest, BadInputIsAClearError) {
  const auto points = torch::rand({1, 5, 3});
  auto msg = error_message_of([&] { ball_query(points, points, 0.5, 8); });
  EXPECT_NE(msg.find("8 neighbours"), std::string::npos) << msg;
  auto nan = points.clone();
  nan[0][2][1] = NAN;
  msg = error_message_of([&] { ball_query(nan, points, 0.5, 2); });
  EXPECT_NE(msg.find("non-finite"), std::string::npos) << msg;
  msg = error_message_of([&] { ball_query(points, torch::rand({1, 5, 2}), 0.5, 2); });
  EXPECT_NE(msg.find("(B, M, 3)"), std::string::npos) << msg;
}

}  // namespace
}  // namespace slipstream::aero
