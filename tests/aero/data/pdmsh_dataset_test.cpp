// PhysicsNeMo-Curator trees (.pdmsh / .pmsh) read in place, the recipe's
// manifest styles, and training on such a tree from the command line. The
// trees are written here by hand in tensordict's documented memmap layout
// (meta.json per level, <key>.memmap raw bytes, tensorclasses as
// meta.json + _tensordict/), not by the reader's code.
#include "aero/data/dataset_source.h"
#include "aero/data/manifest.h"
#include "aero/data/transforms.h"
#include "aero/geometry/triangle_mesh.h"

#include "support/process.h"
#include "support/test_support.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace slipstream::aero {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::error_message_of;
using Tensors = std::map<std::string, torch::Tensor>;

const char* kTdType = "<class 'tensordict._td.TensorDict'>";

std::string dtype_name(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat:
      return "torch.float32";
    case torch::kDouble:
      return "torch.float64";
    case torch::kLong:
      return "torch.int64";
    default:
      ADD_FAILURE() << "dtype";
      return "";
  }
}

// One TensorDict level: its tensors as <key>.memmap, `children` (already
// written under dir/<key>) listed with their types.
void write_level(const std::string& dir, const Tensors& tensors,
                 const std::map<std::string, std::string>& children, std::vector<int64_t> shape) {
  fs::create_directories(dir);
  json meta = json::object();
  for (const auto& [key, t0] : tensors) {
    const auto t = t0.contiguous();
    meta[key] = {{"device", "cpu"},
                 {"shape", t.sizes().vec()},
                 {"dtype", dtype_name(t)},
                 {"is_nested", false}};
    std::ofstream(dir + "/" + key + ".memmap", std::ios::binary)
        .write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  }
  for (const auto& [key, type] : children) meta[key] = {{"type", type}};
  meta["shape"] = shape;
  meta["device"] = "cpu";
  meta["_type"] = kTdType;
  std::ofstream(dir + "/meta.json") << meta.dump();
}

void write_tensorclass_meta(const std::string& dir, const std::string& cls) {
  fs::create_directories(dir);
  std::ofstream(dir + "/meta.json") << json{{"_type", "<class '" + cls + "'>"}}.dump();
}

struct MeshData {
  torch::Tensor points, cells;
  Tensors point_data, cell_data, global_data;
};

// A physicsnemo.mesh.Mesh, as Mesh.save writes it.
void write_mesh(const std::string& dir, const MeshData& m) {
  write_tensorclass_meta(dir, "physicsnemo.mesh.mesh.Mesh");
  const std::string td = dir + "/_tensordict";
  write_level(td + "/point_data", m.point_data, {}, {m.points.size(0)});
  write_level(td + "/cell_data", m.cell_data, {}, {m.cells.size(0)});
  write_level(td + "/global_data", m.global_data, {}, {});
  write_level(td + "/_cache", {}, {}, {});
  Tensors own{{"points", m.points}};
  if (m.cells.numel() > 0) own["cells"] = m.cells;  // memmap keeps no empty tensor files
  write_level(td, own,
              {{"point_data", "TensorDict"},
               {"cell_data", "TensorDict"},
               {"global_data", "TensorDict"},
               {"_cache", "TensorDict"}},
              {});
  if (m.cells.numel() == 0) {  // an empty tensor: metadata only
    std::ifstream in(td + "/meta.json");
    json meta = json::parse(in);
    meta["cells"] = {
        {"device", "cpu"}, {"shape", {0, 1}}, {"dtype", "torch.int64"}, {"is_nested", false}};
    std::ofstream(td + "/meta.json") << meta.dump();
  }
}

// A physicsnemo.mesh.DomainMesh: interior, boundaries/<name>, global_data.
void write_domain(const std::string& dir, const MeshData& interior,
                  const std::map<std::string, MeshData>& boundaries, const Tensors& globals) {
  write_tensorclass_meta(dir, "physicsnemo.mesh.domain_mesh.DomainMesh");
  const std::string td = dir + "/_tensordict";
  write_mesh(td + "/interior", interior);
  std::map<std::string, std::string> names;
  for (const auto& [name, b] : boundaries) {
    write_mesh(td + "/boundaries/" + name, b);
    names[name] = "Mesh";
  }
  write_level(td + "/boundaries", {}, names, {});
  write_level(td + "/global_data", globals, {}, {});
  write_level(td, {},
              {{"interior", "Mesh"}, {"boundaries", "TensorDict"}, {"global_data", "TensorDict"}},
              {});
}

MeshData icosphere_mesh(double radius) {
  const TriangleMesh t = make_icosphere(radius, {0, 0, 0}, 3);
  MeshData m;
  m.points = torch::empty({static_cast<int64_t>(t.vertices.size()), 3}, torch::kFloat);
  for (size_t i = 0; i < t.vertices.size(); ++i) {
    for (int k = 0; k < 3; ++k) m.points[i][k] = t.vertices[i][k];
  }
  m.cells = torch::empty({static_cast<int64_t>(t.faces.size()), 3}, torch::kLong);
  for (size_t i = 0; i < t.faces.size(); ++i) {
    for (int k = 0; k < 3; ++k) m.cells[i][k] = t.faces[i][k];
  }
  return m;
}

Tensors case_globals() {
  return {{"U_inf", torch::tensor({30.f, 0.f, 0.f})},
          {"rho_inf", torch::tensor(1.225f)},
          {"p_inf", torch::tensor(0.f)},
          {"nu", torch::tensor(1.5e-5f)},
          {"L_ref", torch::tensor(5.f)}};
}

// Points in a shell around the unit sphere with analytic-looking fields.
MeshData volume_interior(int64_t n, int64_t seed) {
  torch::manual_seed(seed);
  auto dir = torch::randn({n, 3});
  dir = dir / dir.norm(2, 1, true);
  MeshData m;
  m.points = dir * (1.2 + 2.0 * torch::rand({n, 1}));
  m.cells = torch::zeros({0, 1}, torch::kLong);
  m.point_data["UMeanTrim"] = 30.0 * (1.0 - 1.0 / m.points.norm(2, 1, true).pow(3)) * m.points;
  m.point_data["pMeanTrim"] = m.points.select(1, 0) * 10.0;
  m.point_data["nutMeanTrim"] = 1e-3 * torch::exp(-m.points.norm(2, 1));
  return m;
}

// run_<i>/domain_<i>.pdmsh with its body run_<i>/drivaer_<i>_single_solid.stl.pmsh.
void write_volume_run(const std::string& root, int i, int64_t n) {
  const std::string run = root + "/run_" + std::to_string(i);
  MeshData vehicle = icosphere_mesh(1.0);
  vehicle.cell_data["pMeanTrim"] = torch::zeros({vehicle.cells.size(0)});
  write_domain(run + "/domain_" + std::to_string(i) + ".pdmsh", volume_interior(n, i),
               {{"vehicle", vehicle}}, case_globals());
  write_mesh(run + "/drivaer_" + std::to_string(i) + "_single_solid.stl.pmsh", icosphere_mesh(1.0));
}

void write_surface_run(const std::string& root, int i, bool inward) {
  const std::string run = root + "/run_" + std::to_string(i);
  MeshData vehicle = icosphere_mesh(1.0 + 0.1 * i);
  if (inward) vehicle.cells = vehicle.cells.flip(1).contiguous();
  const int64_t c = vehicle.cells.size(0);
  vehicle.cell_data["pMeanTrim"] = torch::linspace(-1, 1, c);
  vehicle.cell_data["wallShearStressMeanTrim"] = torch::rand({c, 3}) * 1e-3;
  vehicle.global_data["TimeValue"] = torch::tensor(1000.f);
  MeshData interior;
  interior.points = torch::zeros({0, 3});
  interior.cells = torch::zeros({0, 1}, torch::kLong);
  write_domain(run + "/domain_" + std::to_string(i) + ".pdmsh", interior, {{"vehicle", vehicle}},
               case_globals());
}

DatasetSource volume_source(const std::string& root) {
  DatasetSource s;
  s.path = root;
  s.pdmsh.pattern = "run_*/domain_*.pdmsh";
  s.pdmsh.fields = {{"UMeanTrim", "velocity"}, {"pMeanTrim", "pressure"}, {"nutMeanTrim", "nut"}};
  return s;
}

TEST(PdmshDatasetTest, VolumeSamplesAreReadInPlaceWithTheSdfOfTheirBody) {
  testing::TempDir dir;
  write_volume_run(dir.path(), 1, 400);
  write_volume_run(dir.path(), 2, 300);
  std::ofstream(dir.file("manifest.json"))
      << R"({"train": ["run_1"], "val": ["run_2"], "test": []})";
  const DatasetSource source = volume_source(dir.path());
  EXPECT_EQ(resolved_format(source), "pdmsh");
  const auto data = open_dataset(source, "train", "val");
  ASSERT_EQ(data.train->size(), 1u);
  ASSERT_EQ(data.val->size(), 1u);
  const Sample s = data.train->get(0);
  EXPECT_NE(s.id.find("run_1/domain_1.pdmsh"), std::string::npos) << s.id;
  const MeshData want = volume_interior(400, 1);
  EXPECT_TRUE(torch::equal(s.point("points"), want.points));
  EXPECT_TRUE(torch::equal(s.point("velocity"), want.point_data.at("UMeanTrim")));
  EXPECT_TRUE(torch::equal(s.point("pressure"), want.point_data.at("pMeanTrim").unsqueeze(1)));
  const auto r = want.points.norm(2, 1, true);
  EXPECT_LT((s.point("sdf") - (r - 1.0)).abs().max().item<double>(), 0.02);
  EXPECT_GT((s.point("sdf_normals") * (want.points / r)).sum(1).min().item<double>(), 0.98);
  EXPECT_TRUE(torch::equal(s.global("U_inf"), torch::tensor({30.f, 0.f, 0.f})));
  EXPECT_DOUBLE_EQ(s.global_scalar("L_ref", 0), 5.0);
  EXPECT_NEAR(s.global_scalar("rho_inf", 0), 1.225, 1e-6);

  // A request reads only its rows: the rows the loader's own draw picks.
  const Sample part = data.train->get(0, PointRequest{64, "random", 99});
  auto gen = at::detail::createCPUGenerator(99);
  const auto idx = subsample_indices(400, 64, "random", gen);
  EXPECT_EQ(part.num_points(), 64);
  EXPECT_TRUE(torch::equal(part.point("points"), want.points.index_select(0, idx)));
  EXPECT_TRUE(torch::equal(part.point("nut"), s.point("nut").index_select(0, idx)));
  EXPECT_TRUE(torch::allclose(part.point("sdf"), s.point("sdf").index_select(0, idx)));
  const auto layout = data.train->layout();
  EXPECT_EQ(layout.point_channels.at("velocity"), 3);
  EXPECT_EQ(layout.point_channels.at("sdf_normals"), 3);
  EXPECT_EQ(layout.global_sizes.at("U_inf"), 3);
}

TEST(PdmshDatasetTest, EachBodyIsBuiltOnceWhileItStaysInTheCache) {
  testing::TempDir dir;
  write_volume_run(dir.path(), 1, 400);
  write_volume_run(dir.path(), 2, 300);
  std::ofstream(dir.file("manifest.json")) << R"({"train": ["run_1", "run_2"]})";
  DatasetSource source = volume_source(dir.path());
  const auto data = open_dataset(source, "train", "");
  const auto& pdmsh = dynamic_cast<const PdmshDataset&>(*data.train);
  const Sample whole = data.train->get(0);
  for (uint64_t step = 0; step < 4; ++step) {
    const Sample part = data.train->get(step % 2, PointRequest{50, "random", step});
    EXPECT_EQ(part.num_points(), 50);
    // The mean of all the sample's points, for the center transform.
    if (step % 2 == 0) {
      EXPECT_TRUE(torch::allclose(part.points_mean.to(torch::kFloat), whole.point("points").mean(0),
                                  1e-5, 1e-6));
    }
  }
  EXPECT_EQ(pdmsh.bodies_built(), 2);
  // A cache that holds one body: alternating samples rebuild theirs.
  source.pdmsh.body_cache_bytes = 0;
  const auto small = open_dataset(source, "train", "");
  for (uint64_t step = 0; step < 4; ++step)
    small.train->get(step % 2, PointRequest{50, "random", step});
  EXPECT_EQ(dynamic_cast<const PdmshDataset&>(*small.train).bodies_built(), 4);
  // The same SDF either way.
  const PointRequest r{60, "random", 11};
  EXPECT_TRUE(
      torch::equal(small.train->get(1, r).point("sdf"), data.train->get(1, r).point("sdf")));
}

TEST(PdmshDatasetTest, SurfaceSamplesAreTheBoundaryCellsFacingOutward) {
  testing::TempDir dir;
  write_surface_run(dir.path(), 1, /*inward=*/false);
  write_surface_run(dir.path(), 2, /*inward=*/true);
  std::ofstream(dir.file("manifest.json")) << R"({"train": ["run_1", "run_2"]})";
  DatasetSource source;
  source.path = dir.path();
  source.pdmsh.kind = "surface";
  source.pdmsh.fields = {{"pMeanTrim", "pressure"}, {"wallShearStressMeanTrim", "wss"}};
  const auto data = open_dataset(source, "train", "val");
  ASSERT_EQ(data.train->size(), 2u);
  EXPECT_EQ(data.val->size(), 0u);
  for (size_t i = 0; i < 2; ++i) {
    const Sample s = data.train->get(i);
    const double radius = 1.0 + 0.1 * static_cast<double>(i + 1);
    const auto& c = s.point("points");
    EXPECT_EQ(c.size(0), 1280);
    EXPECT_NEAR(s.point("area").sum().item<double>(), 4 * M_PI * radius * radius,
                0.01 * 4 * M_PI * radius * radius);  // inscribed triangles
    EXPECT_GT((s.point("normals") * c).sum(1).min().item<double>(), 0.0) << "sample " << i;
    EXPECT_TRUE(torch::equal(s.point("pressure").squeeze(1), torch::linspace(-1, 1, 1280)));
    EXPECT_EQ(s.point("wss").size(1), 3);
    EXPECT_DOUBLE_EQ(s.global_scalar("TimeValue", 0), 1000.0);  // the boundary's own global
    EXPECT_DOUBLE_EQ(s.global_scalar("L_ref", 0), 5.0);         // the case's
    ASSERT_TRUE(s.mesh.count("connectivity"));
    EXPECT_EQ(s.mesh.at("offsets").size(0), 1281);
    const Sample part = data.train->get(i, PointRequest{100, "block", 3});
    EXPECT_EQ(part.num_points(), 100);
    EXPECT_TRUE(part.mesh.empty());
    EXPECT_GT((part.point("normals") * part.point("points")).sum(1).min().item<double>(), 0.0);
  }
}

TEST(PdmshDatasetTest, ManifestStylesAndSplitKeys) {
  testing::TempDir dir;
  for (int i = 1; i <= 3; ++i) write_volume_run(dir.path(), i, 50);
  DatasetSource source = volume_source(dir.path());
  // A JSON dict with the recipe's own split names.
  std::ofstream(dir.file("manifest.json"))
      << R"({"single_aoa_4_train": ["run_1", "run_3"], "single_aoa_4_val": ["run_2"]})";
  auto data = open_dataset(source, "single_aoa_4_train", "single_aoa_4_val");
  EXPECT_EQ(data.train->size(), 2u);
  EXPECT_EQ(data.val->size(), 1u);
  EXPECT_EQ(split_names(source),
            (std::vector<std::string>{"single_aoa_4_train", "single_aoa_4_val"}));
  auto msg = error_message_of([&] { open_dataset(source, "train", "val"); });
  EXPECT_NE(msg.find("no split 'train'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("single_aoa_4_train, single_aoa_4_val"), std::string::npos) << msg;
  // Style A: a JSON list for train, a text file for val.
  std::ofstream(dir.file("train.json")) << R"(["run_2", "run_3"])";
  std::ofstream(dir.file("val.txt")) << "# held out\n\nrun_1\n";
  source.train_manifest = dir.file("train.json");
  source.val_manifest = dir.file("val.txt");
  data = open_dataset(source, "train", "val");
  ASSERT_EQ(data.train->size(), 2u);
  EXPECT_NE(data.train->get(0).id.find("run_2/"), std::string::npos);
  ASSERT_EQ(data.val->size(), 1u);
  EXPECT_NE(data.val->get(0).id.find("run_1/"), std::string::npos);
  // A manifest naming a run that is not there.
  std::ofstream(dir.file("val.txt")) << "run_1\nrun_9\n";
  msg = error_message_of([&] { open_dataset(source, "train", "val"); });
  EXPECT_NE(msg.find(dir.file("val.txt")), std::string::npos) << msg;
  EXPECT_NE(msg.find("'run_9'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("split 'val'"), std::string::npos) << msg;
  // No val split at all.
  source.val_manifest.clear();
  EXPECT_EQ(open_dataset(source, "train", "").val->size(), 0u);
  // The default name may be absent (no validation); a mistyped one may not.
  source.train_manifest.clear();
  std::ofstream(dir.file("manifest.json")) << R"({"train": ["run_1"], "val": ["run_2"]})";
  EXPECT_EQ(open_dataset(source, "train", "val").val->size(), 1u);
  msg = error_message_of([&] { open_dataset(source, "train", "valid"); });
  EXPECT_NE(msg.find("val_split"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no split 'valid' (it has: train, val)"), std::string::npos) << msg;
  std::ofstream(dir.file("manifest.json")) << R"({"train": ["run_1", "run_2"]})";
  EXPECT_EQ(open_dataset(source, "train", "val").val->size(), 0u);
}

TEST(PdmshDatasetTest, AMissingFieldOrBodyIsNamedBeforeTheFirstStep) {
  testing::TempDir dir;
  write_volume_run(dir.path(), 1, 50);
  std::ofstream(dir.file("manifest.json")) << R"({"train": ["run_1"]})";
  const std::string pd =
      dir.file("run_1/domain_1.pdmsh/_tensordict/interior/_tensordict/point_data");
  {  // drop pMeanTrim from the point data
    std::ifstream in(pd + "/meta.json");
    json meta = json::parse(in);
    meta.erase("pMeanTrim");
    std::ofstream(pd + "/meta.json") << meta.dump();
  }
  const DatasetSource source = volume_source(dir.path());
  auto data = open_dataset(source, "train", "val");
  SampleCheck check;
  check.required.point_channels = {{"points", 3}, {"sdf", 1}, {"velocity", 3}, {"pressure", 1}};
  data.train->set_check(check);
  auto msg = error_message_of([&] { data.train->check_headers(); });
  EXPECT_NE(msg.find("run_1/domain_1.pdmsh"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no field 'pMeanTrim'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("target 'pressure'"), std::string::npos) << msg;
  // Without its body the SDF cannot be computed.
  testing::remove_tree(dir.file("run_1/drivaer_1_single_solid.stl.pmsh"));
  testing::remove_tree(dir.file("run_1/domain_1.pdmsh/_tensordict/boundaries/vehicle"));
  std::ofstream(dir.file("run_1/domain_1.pdmsh/_tensordict/boundaries/meta.json"))
      << json{{"shape", json::array()}, {"device", "cpu"}, {"_type", kTdType}}.dump();
  msg = error_message_of([&] { data.train->get(0); });
  EXPECT_NE(msg.find("needs a body for its SDF"), std::string::npos) << msg;
  EXPECT_NE(msg.find("*_single_solid.stl.pmsh"), std::string::npos) << msg;
}

TEST(ManifestTest, ReadsTheThreeStyles) {
  testing::TempDir dir;
  std::ofstream(dir.file("a.json")) << R"({"format": "x", "train": ["b", "a"], "val": []})";
  auto m = read_manifest(dir.file("a.json"));
  EXPECT_TRUE(m.named_splits);
  EXPECT_EQ(m.format, "x");
  EXPECT_EQ(m.split("train"), (std::vector<std::string>{"b", "a"}));
  std::ofstream(dir.file("b.json")) << R"(  ["r1", "r2"])";
  m = read_manifest(dir.file("b.json"));
  EXPECT_FALSE(m.named_splits);
  EXPECT_EQ(m.split("anything"), (std::vector<std::string>{"r1", "r2"}));
  std::ofstream(dir.file("c.txt")) << "r1\n  # no\n\n r2 \n";
  EXPECT_EQ(read_manifest(dir.file("c.txt")).split("x"), (std::vector<std::string>{"r1", "r2"}));
  std::ofstream(dir.file("d.json")) << R"({"train": [1]})";
  EXPECT_NE(error_message_of([&] { read_manifest(dir.file("d.json")); }).find("non-string"),
            std::string::npos);
  EXPECT_NE(error_message_of([&] { read_manifest(dir.file("nope.json")); }).find("nope.json"),
            std::string::npos);
  const std::vector<std::string> samples{"run_1/domain_1.pdmsh", "run_10/domain_10.pdmsh",
                                         "group/run_2/x.pdmsh"};
  EXPECT_EQ(match_entries({"run_10", "run_1", "group/run_2"}, samples, "m", "train"),
            (std::vector<size_t>{1, 0, 2}));
  EXPECT_EQ(match_entries({"run_2"}, samples, "m", "train"), (std::vector<size_t>{2}));
}

// `slipstream train` on a .pdmsh tree, alone and with an extra dataset.
TEST(PdmshCliTest, TrainsOneEpochOnACuratorTreeAndChecksExtraDatasets) {
  testing::TempDir dir;
  const std::string a = dir.file("a"), b = dir.file("b");
  for (int i = 1; i <= 3; ++i) write_volume_run(a, i, 600);
  std::ofstream(a + "/manifest.json") << R"({"train": ["run_1", "run_2"], "val": ["run_3"]})";
  write_volume_run(b, 7, 500);
  std::ofstream(b + "/manifest.json") << R"(["run_7"])";
  const std::vector<std::string> common{"train",
                                        "model=transolver_small",
                                        "dataset=drivaer_ml_volume",
                                        "dataset.path=" + a,
                                        "dataset.sampling_resolution=256",
                                        "training.num_epochs=1",
                                        "output_dir=" + dir.file("runs"),
                                        "logging.tensorboard=false"};
  auto args = common;
  args.push_back("run_id=one");
  auto r = testing::run_slipstream(args, std::chrono::seconds(120));
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream log(dir.file("runs/one/metrics.jsonl"));
  int train_steps = 0, val = 0;
  for (std::string line; std::getline(log, line);) {
    const auto j = json::parse(line);
    const std::string phase = j.value("phase", "");
    if (phase == "train_step") ++train_steps;
    if (phase == "val_step") ++val;
  }
  EXPECT_EQ(train_steps, 2) << r.output;
  EXPECT_EQ(val, 1) << r.output;
  // The recipe's infer_split picks the split to predict, at full resolution.
  r = testing::run_slipstream(
      {"infer", "--checkpoint", dir.file("runs/one"), "infer_split=val", "--out", dir.file("pred")},
      std::chrono::seconds(120));
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream pred(dir.file("pred/metrics.jsonl"));
  int predicted = 0;
  for (std::string line; std::getline(pred, line);) {
    const auto j = json::parse(line);
    if (j.value("phase", "") == "infer_step") {
      ++predicted;
      EXPECT_EQ(j.value("points", 0), 600) << line;
    }
  }
  EXPECT_EQ(predicted, 1) << r.output;
  // Two datasets: 2 + 1 training samples (b's list manifest is its train split).
  args = common;
  args.push_back("run_id=two");
  args.push_back("extra_datasets=[{config: drivaer_ml_volume, path: " + b +
                 ", train_manifest: " + b + "/manifest.json}]");
  args.push_back("val_split=null");
  r = testing::run_slipstream(args, std::chrono::seconds(120));
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream log2(dir.file("runs/two/metrics.jsonl"));
  train_steps = 0;
  for (std::string line; std::getline(log2, line);) {
    const auto j = json::parse(line);
    if (j.value("phase", "") == "train_step") ++train_steps;
  }
  EXPECT_EQ(train_steps, 3) << r.output;
  // Targets that differ are refused before any work.
  args = common;
  args.push_back("run_id=three");
  args.push_back("extra_datasets=[{config: drivaer_ml_volume, path: " + b +
                 ", targets: {nut: vector}}]");
  r = testing::run_slipstream(args, std::chrono::seconds(60));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("extra dataset 'drivaer_ml_volume' declares targets"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir.file("runs/three/checkpoints")));
  args = common;
  args.push_back("extra_datasets=[{config: prepared, path: " + b + "}]");
  r = testing::run_slipstream(args, std::chrono::seconds(60));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("normalises its targets differently"), std::string::npos) << r.output;
  args = common;
  args.push_back("extra_datasets=[{config: drivaer_ml_volume, pth: " + b + "}]");
  r = testing::run_slipstream(args, std::chrono::seconds(60));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("has no key 'pth'"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace slipstream::aero
