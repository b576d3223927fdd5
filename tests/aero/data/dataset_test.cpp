// The synthetic data is physics; sample files round-trip; bad files fail
// with messages that name them; the loader prefetches in order and rethrows
// worker errors on the caller's thread.
#include "aero/data/dataset_source.h"
#include "aero/data/loader.h"
#include "aero/data/sample_file.h"
#include "core/io/safetensors.h"
#include "support/recipe_support.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

namespace slipstream::aero {
namespace {

using testing::error_message_of;
namespace fs = std::filesystem;

// What a volume run needs of each sample.
SampleCheck volume_check() {
  SampleCheck c;
  c.required = synthetic_layout();
  c.required.point_channels.erase("volume");
  c.targets = {"velocity", "pressure", "nut"};
  return c;
}

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
  auto a = make_synthetic_sample(3, o), b = make_synthetic_sample(3, o),
       c = make_synthetic_sample(4, o);
  EXPECT_TRUE(torch::equal(a.point("points"), b.point("points")));
  EXPECT_TRUE(torch::equal(a.point("pressure"), b.point("pressure")));
  EXPECT_FALSE(torch::equal(a.point("points"), c.point("points")));
  volume_check()(a);
  EXPECT_EQ(layout_of(a).point_channels, synthetic_layout().point_channels);
  EXPECT_EQ(layout_of(a).global_sizes, synthetic_layout().global_sizes);
  EXPECT_GT(a.point("sdf").min().item<double>(), 0.0);  // every point outside the body
  EXPECT_NEAR((a.point("sdf_normals").norm(2, 1) - 1).abs().max().item<double>(), 0.0, 1e-5);
  // Bernoulli: p + |u|^2/2 is the same everywhere.
  auto head = a.point("pressure").squeeze(1) + 0.5 * a.point("velocity").pow(2).sum(1);
  EXPECT_LT((head - head[0]).abs().max().item<double>(), 1e-4);
}

TEST(DirectoryDatasetTest, RoundTripAndBadFilesNameTheFile) {
  testing::TempDir dir;
  SyntheticOptions o;
  o.points_per_sample = 300;
  write_synthetic_directory(dir.path(), o, 3, 1);
  auto splits = open_sample_directory(dir.path());
  splits.train->set_check(volume_check());
  EXPECT_EQ(splits.train->size(), 3u);
  EXPECT_EQ(splits.val->size(), 1u);
  auto s = splits.train->get(1);
  const Sample want = make_synthetic_sample(1, o);
  // Stored in the file's permutation of the rows (sample_file.h).
  const auto perm =
      row_permutation(300, SampleFile(dir.file("sample_00001.safetensors")).row_seed());
  EXPECT_TRUE(
      torch::equal(s.point("points"), want.point("points").index_select(0, torch::tensor(perm))));
  EXPECT_TRUE(torch::equal(s.global("U_inf"), want.global("U_inf")));
  EXPECT_EQ(s.global_scalar("L_ref", 0.0), want.global_scalar("L_ref", 1.0));
  EXPECT_EQ(splits.train->layout().point_channels, synthetic_layout().point_channels);
  EXPECT_EQ(splits.train->layout().global_sizes, synthetic_layout().global_sizes);

  // Missing directory.
  EXPECT_NE(error_message_of([&] { open_sample_directory(dir.file("nope")); }).find("nope"),
            std::string::npos);
  // Truncated sample.
  const std::string f0 = dir.file("sample_00000.safetensors");
  std::filesystem::resize_file(f0, std::filesystem::file_size(f0) / 2);
  EXPECT_NE(error_message_of([&] { splits.train->get(0); }).find(f0), std::string::npos);
  // Empty sample.
  std::ofstream(f0, std::ios::trunc).close();
  EXPECT_NE(error_message_of([&] { splits.train->get(0); }).find(f0), std::string::npos);
  // NaN coordinates: refused when written, the file left as it was.
  Sample bad = make_synthetic_sample(2, o);
  bad.point_data["points"][5][1] = NAN;
  const std::string f2 = dir.file("sample_00002.safetensors");
  const auto msg = error_message_of([&] { write_sample_file(f2, bad); });
  EXPECT_NE(msg.find(f2), std::string::npos) << msg;
  EXPECT_NE(msg.find("non-finite"), std::string::npos) << msg;
  EXPECT_NO_THROW(splits.train->get(2));
  // A sample missing a target field.
  const Sample good = make_synthetic_sample(2, o);
  write_safetensors(f2, {{"points", good.point("points")},
                         {"sdf", good.point("sdf")},
                         {"sdf_normals", good.point("sdf_normals")},
                         {"U_inf", good.global("U_inf")}});
  const auto missing = error_message_of([&] { splits.train->get(2); });
  EXPECT_NE(missing.find("has no point field 'nut'"), std::string::npos) << missing;
  EXPECT_NE(missing.find(f2), std::string::npos) << missing;
}

TEST(SyntheticTest, SurfaceSampleIsPotentialFlowOnItsSphere) {
  SyntheticOptions o;
  o.kind = "surface";
  o.points_per_sample = 5000;
  const Sample s = make_synthetic_sample(2, o);
  const double a = s.global_scalar("L_ref", 0) / 2;
  const int64_t n = s.num_points();
  EXPECT_NEAR(static_cast<double>(n), 5000.0, 200.0);
  // Closed sphere: the areas sum to 4 pi a^2 (less the chord error).
  EXPECT_NEAR(s.point("area").sum().item<double>(), 4 * M_PI * a * a, 0.01 * 4 * M_PI * a * a);
  EXPECT_NEAR(s.global_scalar("A_ref", 0), M_PI * a * a, 1e-9);
  // Cp = (p - p_inf) / q spans [1 - 9/4, 1]: stagnation 1, equator -1.25.
  const double q = s.free_stream().dynamic_pressure();
  const auto cp = s.point("pressure").to(torch::kDouble) / q;
  EXPECT_NEAR(cp.max().item<double>(), 1.0, 0.01);
  EXPECT_NEAR(cp.min().item<double>(), -1.25, 0.01);
  // The friction lies in the wall (no normal part) and is smallest at the
  // stagnation point, facing the flow.
  const auto wss = s.point("wss").to(torch::kDouble);
  const auto normals = s.point("normals").to(torch::kDouble);
  EXPECT_LT((wss * normals).sum(1).abs().max().item<double>(), 1e-6 * q);
  const auto stagnation = cp.argmax().item<int64_t>();
  EXPECT_LT(wss[stagnation].norm().item<double>(), 0.1 * wss.norm(2, 1).max().item<double>());
  // Stored as the wall's stress on the fluid (OpenFOAM's, DrivAerML's):
  // against the surface flow wherever it is not negligible.
  const auto flow = s.global("U_inf").to(torch::kDouble).view({1, 3});
  const auto along = (wss * flow).sum(1);
  const auto strong = wss.norm(2, 1) > 0.1 * wss.norm(2, 1).max();
  EXPECT_GT(strong.sum().item<int64_t>(), n / 2);
  EXPECT_TRUE((along.masked_select(strong) < 0).all().item<bool>());
  // The mesh is kept for writing back: C cells.
  EXPECT_EQ(s.mesh.at("offsets").size(0), n + 1);
  // Surface layout and a file round-trip that keeps the mesh out of the fields.
  EXPECT_EQ(layout_of(s).point_channels, synthetic_layout("surface").point_channels);
  testing::TempDir dir;
  write_sample_file(dir.file("s.safetensors"), s);
  const Sample back = read_sample_file(dir.file("s.safetensors"));
  // The polygons are stored in the rows' order: the same cells.
  EXPECT_EQ(std::get<0>(back.mesh.at("connectivity").sort())
                .equal(std::get<0>(s.mesh.at("connectivity").sort())),
            true);
  EXPECT_EQ(back.point_data.count("mesh/vertices"), 0u);
  EXPECT_EQ(read_sample_layout(dir.file("s.safetensors")).point_channels,
            synthetic_layout("surface").point_channels);
}

TEST(DirectoryDatasetTest, ManifestSplitsInEitherFormAndUnknownSplitsAreNamed) {
  testing::TempDir dir;
  SyntheticOptions o;
  o.points_per_sample = 300;
  write_synthetic_directory(dir.path(), o, 2, 1);
  // The recipe's form: no format key, run names, a test split.
  fs::rename(dir.file("sample_00002.safetensors"), dir.file("run_7.safetensors"));
  std::ofstream(dir.file("manifest.json"))
      << R"({"train": ["sample_00000.safetensors", "sample_00001"], "val": [], )"
      << R"("test": ["run_7"]})";
  EXPECT_EQ(split_names(dir.path()), (std::vector<std::string>{"test", "train", "val"}));
  auto test = open_split(dir.path(), "test");
  ASSERT_EQ(test->size(), 1u);
  EXPECT_NE(test->get(0).id.find("run_7.safetensors"), std::string::npos);
  EXPECT_EQ(open_sample_directory(dir.path()).train->size(), 2u);
  const auto unknown = error_message_of([&] { open_split(dir.path(), "holdout"); });
  EXPECT_NE(unknown.find("holdout"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("test, train, val"), std::string::npos) << unknown;
  std::ofstream(dir.file("manifest.json")) << R"({"train": ["run_8"]})";
  const auto missing = error_message_of([&] { open_sample_directory(dir.path()); });
  EXPECT_NE(missing.find("run_8"), std::string::npos) << missing;
  std::ofstream(dir.file("manifest.json")) << R"({"format": "other", "train": []})";
  EXPECT_NE(error_message_of([&] { open_sample_directory(dir.path()); }).find("other"),
            std::string::npos);
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
  SampleLayout layout() const override { return synthetic_layout(); }
};

// Earlier samples take longer: several workers finish them out of order.
struct SlowDataset : Dataset {
  size_t size() const override { return 6; }
  Sample get(size_t i) const override {
    std::this_thread::sleep_for(std::chrono::milliseconds(5 * (6 - static_cast<int>(i))));
    SyntheticOptions o;
    o.points_per_sample = 64;
    return make_synthetic_sample(static_cast<int64_t>(i), o);
  }
  std::string describe() const override { return "slow"; }
  SampleLayout layout() const override { return synthetic_layout(); }
};

TEST(PrefetchLoaderTest, SeveralWorkersDeliverTheSameBatchesInOrder) {
  auto ds = std::make_shared<SlowDataset>();
  LoaderOptions o;
  o.sampling_resolution = 32;
  o.inputs = testing::volume_inputs();
  const std::vector<size_t> order{5, 0, 3, 1, 4, 2};
  std::vector<Batch> one;
  {
    PrefetchLoader loader(ds, order, o, 2);
    while (loader.has_next()) one.push_back(loader.next());
  }
  o.num_workers = 4;
  PrefetchLoader loader(ds, order, o, 2);
  for (size_t i = 0; i < order.size(); ++i) {
    const Batch b = loader.next();
    EXPECT_EQ(b.sample_index, order[i]);
    EXPECT_TRUE(torch::equal(b.target, one[i].target)) << i;
    EXPECT_TRUE(torch::equal(b.inputs.at("embedding"), one[i].inputs.at("embedding"))) << i;
  }
  EXPECT_FALSE(loader.has_next());
}

TEST(PrefetchLoaderTest, DeliversInOrderAndRethrowsWorkerErrorsInOrder) {
  for (int workers : {1, 3}) {
    auto ds = std::make_shared<FailingDataset>();
    LoaderOptions o;
    o.sampling_resolution = 32;
    o.inputs = testing::volume_inputs();
    o.num_workers = workers;
    PrefetchLoader loader(ds, {0, 1, 2, 3, 4}, o, 1);
    for (size_t i = 0; i < 3; ++i) {
      auto b = loader.next();
      EXPECT_EQ(b.sample_index, i);
      EXPECT_EQ(b.inputs.at("embedding").sizes(), (std::vector<int64_t>{1, 32, 7}));
      EXPECT_EQ(b.inputs.at("fx").sizes(), (std::vector<int64_t>{1, 32, 3}));
      EXPECT_EQ(b.target.sizes(), (std::vector<int64_t>{1, 32, 5}));
    }
    try {
      loader.next();
      FAIL() << "the worker's error must reach the caller";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "sample 3 is corrupt");
    }
  }
}

TEST(PrefetchLoaderTest, SubsampleIsDeterministicAndTargetsLineUpWithPoints) {
  SyntheticOptions so;
  so.points_per_sample = 1000;
  auto s = make_synthetic_sample(0, so);
  LoaderOptions o;
  o.sampling_resolution = 100;
  o.inputs = testing::volume_inputs();
  auto a = make_host_batch(s, o, 42), b = make_host_batch(s, o, 42);
  EXPECT_TRUE(torch::equal(a.inputs.at("embedding"), b.inputs.at("embedding")));
  // Each row's target belongs to that row's point (identity fields: unchanged).
  auto p = a.inputs.at("embedding")[0].narrow(1, 0, 3);
  for (int64_t i = 0; i < 5; ++i) {
    auto row = (s.point("points") - p[i]).abs().sum(1).argmin().item<int64_t>();
    EXPECT_TRUE(torch::equal(a.target[0][i].narrow(0, 0, 3), s.point("velocity")[row]));
  }
}

}  // namespace
}  // namespace slipstream::aero
