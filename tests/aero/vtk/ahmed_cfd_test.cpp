// Real CFD that Slipstream did not make: two OpenFOAM Ahmed-body runs
// (tests/fixtures/ahmed, see its README). The surface's pressure and wall
// shear stress, integrated as `infer` integrates them, must give OpenFOAM's
// own forceCoeffs; then each run goes through prepare -> train -> infer for
// the surface and the volume models, and a body unlike the one trained on is
// flagged as outside the training data.
#include "aero/infer/inference.h"
#include "aero/vtk/raw_runs.h"
#include "support/process.h"
#include "support/recipe_support.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace slipstream::aero {
namespace {

namespace fs = std::filesystem;

std::string ahmed_run(int i) { return testing::fixtures_dir() + "/ahmed/run_" + std::to_string(i); }

FieldSchema surface_fields() { return testing::surface_field_schema(); }

// The truth fields of a surface sample as (C, 4): pressure, wss.
torch::Tensor truth_of(const Sample& s) {
  return torch::cat({s.point("pressure"), s.point("wss")}, 1);
}

ForceSettings settings(ShearConvention shear) {
  ForceSettings f;
  f.shear = shear;
  return f;
}

TEST(AhmedCfdTest, TheSolversOwnFieldsGiveOpenFoamsForceCoefficients) {
  for (int run : {15, 16}) {
    std::vector<std::string> warnings;
    const Sample s = read_raw_surface_run(ahmed_run(run), surface_fields(), {}, &warnings);
    ASSERT_TRUE(s.has_global("CD_cfd") && s.has_global("CL_cfd")) << run;
    const double cd = s.global_scalar("CD_cfd", NAN), cl = s.global_scalar("CL_cfd", NAN);
    // The polygons' vertex order gives normals into the body (OpenFOAM's
    // faces point out of the fluid): read_raw_surface_run turns them outward.
    ASSERT_EQ(warnings.size(), 1u) << run;
    EXPECT_NE(warnings[0].find("inward"), std::string::npos) << warnings[0];
    const auto f =
        surface_forces(s, truth_of(s), surface_fields(), settings(ShearConvention::kWallOnFluid));
    EXPECT_NEAR(f.at("CD"), cd, 0.005 * cd) << "run " << run;
    EXPECT_NEAR(f.at("CL"), cl, 0.01 * std::abs(cd)) << "run " << run;
    EXPECT_NEAR(f.at("CS"), 0.0, 1e-6) << "run " << run;  // a symmetric body
    // The field read the other way round puts the drag far off: the friction
    // share (~10 %) counts twice. This is the error the convention prevents.
    const auto wrong =
        surface_forces(s, truth_of(s), surface_fields(), settings(ShearConvention::kFluidOnWall));
    EXPECT_LT(wrong.at("CD"), 0.9 * cd) << "run " << run;
  }
}

TEST(AhmedCfdTest, ForcesNeedTheShearConventionDeclared) {
  const Sample s = read_raw_surface_run(ahmed_run(15), surface_fields(), {});
  const auto msg = testing::error_message_of(
      [&] { surface_forces(s, truth_of(s), surface_fields(), ForceSettings{}); });
  EXPECT_NE(msg.find("dataset.shear_stress"), std::string::npos) << msg;
}

// The force loss's weights (force_loss.h) map a prediction's error in the
// model's space to the change of CD, CL and CS that infer's integral
// (surface_forces, checked against OpenFOAM above) sees, in either shear
// convention.
TEST(AhmedCfdTest, TheForceLossWeightsGiveTheCoefficientChangeOfAPrediction) {
  const FieldSchema fields = surface_fields();
  const Sample s = read_raw_surface_run(ahmed_run(16), fields, {});
  const FreeStream fs = s.free_stream();
  const auto truth = truth_of(s).to(torch::kDouble);
  // A wrong prediction: pressure scaled and shifted along x, shear turned and shrunk.
  const auto x = s.point("points").select(1, 0).to(torch::kDouble).unsqueeze(1);
  const auto pred =
      torch::cat({truth.narrow(1, 0, 1) * 1.1 + 30.0 * torch::sin(8.0 * x),
                  truth.narrow(1, 1, 3) * 0.8 + 0.2 * truth.narrow(1, 1, 3).roll(1, 1)},
                 1);
  const auto to_model = [&](const torch::Tensor& physical) {
    return torch::cat({fields.to_model(fields.fields()[0], physical.narrow(1, 0, 1), fs),
                       fields.to_model(fields.fields()[1], physical.narrow(1, 1, 3), fs)},
                      1);
  };
  const auto u = s.global("U_inf").to(torch::kDouble);
  const Vec3 flow{u[0].item<double>(), u[1].item<double>(), u[2].item<double>()};
  for (const auto shear : {ShearConvention::kWallOnFluid, ShearConvention::kFluidOnWall}) {
    ForceLossFrame frame;
    frame.coefficients = {"CD", "CL", "CS"};
    frame.shear = shear;
    const auto w = force_loss_weights(s.point("normals"), s.point("area"), fields, fs, flow,
                                      s.global_scalar("A_ref", 0.0), 1.0, frame)
                       .to(torch::kDouble);
    const auto dc =
        ((to_model(pred) - to_model(truth)).unsqueeze(-1) * w).sum(torch::IntArrayRef{0, 1});
    const auto f_pred = surface_forces(s, pred, fields, settings(shear));
    const auto f_true = surface_forces(s, truth, fields, settings(shear));
    for (int64_t k = 0; k < 3; ++k) {
      const std::string name = frame.coefficients[static_cast<size_t>(k)];
      const double expected = f_pred.at(name) - f_true.at(name);
      EXPECT_NEAR(dc[k].item<double>(), expected, 1e-6 + 1e-4 * std::abs(expected))
          << name << " " << to_string(shear);
    }
    EXPECT_GT(std::abs(f_pred.at("CD") - f_true.at("CD")), 0.005);  // a change worth checking
  }
}

std::vector<nlohmann::json> records(const std::string& path, const std::string& phase) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["phase"] == phase) out.push_back(j);
  }
  return out;
}

// prepare (the runs as shipped, split by a manifest) -> train a small model
// for one epoch -> infer the val split at full resolution.
struct Chain {
  testing::TempDir dir;
  std::string prepared, splits;
  Chain() : prepared(dir.file("prepared")), splits(dir.file("splits.json")) {
    std::ofstream(splits) << R"({"train": ["run_15"], "val": ["run_16"]})";
  }
  void prepare(const std::string& dataset) {
    const auto e =
        testing::run_slipstream({"prepare", "--in", testing::fixtures_dir() + "/ahmed", "--out",
                                 prepared, "--splits", splits, "dataset=" + dataset},
                                std::chrono::seconds(300));
    ASSERT_EQ(e.code, 0) << e.output;
  }
  // Trains `model` (with `sizes`, a small one) and infers val; the infer_step records.
  std::vector<nlohmann::json> train_and_infer(const std::string& model, const std::string& dataset,
                                              const std::vector<std::string>& sizes) {
    std::vector<std::string> args{"train",
                                  "model=" + model,
                                  "dataset=" + dataset,
                                  "dataset.path=" + prepared,
                                  "dataset.sampling_resolution=2048",
                                  "training.num_epochs=1",
                                  "device=cpu",
                                  "run_id=" + model,
                                  "output_dir=" + dir.file("runs")};
    args.insert(args.end(), sizes.begin(), sizes.end());
    auto e = testing::run_slipstream(args, std::chrono::seconds(300));
    EXPECT_EQ(e.code, 0) << e.output;
    const std::string out = dir.file("infer_" + model);
    e = testing::run_slipstream({"infer", "--checkpoint", dir.file("runs/" + model), "--split",
                                 "val", "--out", out, "--device", "cpu"},
                                std::chrono::seconds(300));
    EXPECT_EQ(e.code, 0) << e.output;
    return records(out + "/metrics.jsonl", "infer_step");
  }
};

const std::vector<std::string> kSmallTransolver{"model.n_layers=1", "model.n_hidden=32",
                                                "model.n_head=2", "model.slice_num=8"};
const std::vector<std::string> kSmallGeoTransolver{"model.n_layers=1",
                                                   "model.n_hidden=32",
                                                   "model.n_head=2",
                                                   "model.slice_num=8",
                                                   "model.radii=[0.05, 0.2]",
                                                   "model.neighbors_in_radius=[4, 8]",
                                                   "model.n_hidden_local=8",
                                                   "model.mlp_recompute_gelu=false",
                                                   "model.mlp_keep_gelu_layers=0"};

TEST(AhmedCfdTest, SurfaceRunsGoThroughPrepareTrainAndInferWithTheSolversForces) {
  Chain chain;
  chain.prepare("ahmed_surface");
  const auto manifest = nlohmann::json::parse(std::ifstream(chain.prepared + "/manifest.json"));
  EXPECT_EQ(manifest["train"], nlohmann::json::array({"run_15.safetensors"}));
  EXPECT_EQ(manifest["val"], nlohmann::json::array({"run_16.safetensors"}));
  // Transolver with the force loss on, every cell a step: its val step's
  // CD_error and CL_error are infer's |pred - true| for the same model.
  auto transolver = kSmallTransolver;
  transolver.insert(transolver.end(),
                    {"loss.forces.weight=0.01", "dataset.sampling_resolution=200000"});
  for (const auto& [model, sizes] : {std::pair{"transolver_surface", transolver},
                                     std::pair{"geotransolver_surface", kSmallGeoTransolver}}) {
    const auto steps = chain.train_and_infer(model, "ahmed_surface", sizes);
    ASSERT_EQ(steps.size(), 1u) << model;
    const auto& forces = steps[0]["forces"];
    ASSERT_TRUE(forces.contains("cfd")) << steps[0].dump();
    // The true fields' integral beside OpenFOAM's own coefficients.
    const double cd = forces["cfd"]["CD"];
    EXPECT_NEAR(forces["true"]["CD"].get<double>(), cd, 0.005 * cd) << model;
    EXPECT_NEAR(forces["true"]["CL"].get<double>(), forces["cfd"]["CL"].get<double>(), 0.01 * cd)
        << model;
    EXPECT_TRUE(std::isfinite(forces["pred"]["CD"].get<double>())) << model;
    EXPECT_TRUE(steps[0]["metrics"].contains("pressure_l2")) << model;
    // Trained on a 1.27° slant alone, the 26.57° body is flagged.
    EXPECT_EQ(steps[0]["in_distribution"], false) << steps[0].dump();
    std::vector<std::string> outside;
    for (const auto& o : steps[0]["out_of_distribution"]) outside.push_back(o["name"]);
    EXPECT_NE(std::find(outside.begin(), outside.end(), "phi"), outside.end()) << model;
    const auto val =
        records(chain.dir.file("runs/" + std::string(model) + "/metrics.jsonl"), "val_step");
    ASSERT_FALSE(val.empty()) << model;
    if (std::string(model) != "transolver_surface") {
      EXPECT_FALSE(val.back().contains("CD_error")) << model;
      continue;
    }
    for (const char* c : {"CD", "CL"}) {
      const double infer_error =
          std::abs(forces["pred"][c].get<double>() - forces["true"][c].get<double>());
      EXPECT_NEAR(val.back()[std::string(c) + "_error"].get<double>(), infer_error,
                  1e-6 + 1e-4 * infer_error)
          << c;
    }
  }
  // The body it was trained on is not.
  const std::string out = chain.dir.file("infer_train");
  const auto e =
      testing::run_slipstream({"infer", "--checkpoint", chain.dir.file("runs/transolver_surface"),
                               "--split", "train", "--out", out, "--device", "cpu"},
                              std::chrono::seconds(300));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_EQ(e.output.find("outside the training data:"), std::string::npos) << e.output;
  const auto train = records(out + "/metrics.jsonl", "infer_step");
  ASSERT_EQ(train.size(), 1u);
  EXPECT_EQ(train[0]["in_distribution"], true) << train[0].dump();
}

// scripts/ahmed_dataset.sh with Debian's OpenFOAM: one coarse case from
// nothing (the body's STL, blockMesh + snappyHexMesh, simpleFoam until CD
// settles, then the averaging), read back as a case directory: surface and
// volume through prepare --format openfoam, the surface through train and
// infer, its averaged fields' integral against OpenFOAM's averaged
// forceCoeffs. A second call finds the case done and leaves it.
TEST(AhmedCfdTest, TheDatasetGeneratorsCaseGoesThroughPrepareTrainAndInfer) {
  if (!fs::exists("/usr/share/openfoam/etc/bashrc")) {
    if (std::getenv("SLIPSTREAM_NO_OPENFOAM") != nullptr) GTEST_SKIP() << "no OpenFOAM";
    FAIL() << "OpenFOAM is not installed: apt-get install openfoam (scripts/install_deps.sh "
              "--tests does), or set SLIPSTREAM_NO_OPENFOAM=1 to skip this test";
  }
  testing::TempDir dir;
  const std::vector<std::string> generate{
      std::string(SLIPSTREAM_SOURCE_DIR) + "/scripts/ahmed_dataset.sh",
      dir.file("cases"),
      "--cases",
      "1",
      "--jobs",
      "1",
      "--mesh",
      "coarse",
      "--export",
      dir.file("raw")};
  const std::vector<std::string> env{"SLIPSTREAM_BIN=" + testing::slipstream_bin()};
  auto e = testing::Process("/bin/bash", generate, env).wait(std::chrono::seconds(600));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_OUTPUT_HAS(e, "run_1: phi ");
  EXPECT_OUTPUT_HAS(e, "1 of 1 cases done");
  ASSERT_TRUE(fs::exists(dir.file("cases/run_1/done")));
  const std::vector<std::string> fields{
      "--field", "velocity=UMean", "--field", "pressure=pMean",
      "--field", "nut=nutMean",    "--field", "wss=wallShearStressMean"};
  for (const char* kind : {"surface", "volume"}) {
    std::vector<std::string> prepare{"prepare",
                                     "--format",
                                     "openfoam",
                                     "--in",
                                     dir.file("cases"),
                                     "--out",
                                     dir.file(kind),
                                     "--patch",
                                     "body",
                                     "--val-fraction",
                                     "0",
                                     std::string("dataset=ahmed_") + kind};
    prepare.insert(prepare.end(), fields.begin(), fields.end());
    e = testing::run_slipstream(prepare, std::chrono::seconds(300));
    ASSERT_EQ(e.code, 0) << e.output;
  }
  std::vector<std::string> train{"train",
                                 "model=transolver_surface",
                                 "dataset=ahmed_surface",
                                 "dataset.path=" + dir.file("surface"),
                                 "val_split=null",
                                 "training.num_epochs=1",
                                 "device=cpu",
                                 "run_id=generated",
                                 "output_dir=" + dir.file("runs")};
  train.insert(train.end(), kSmallTransolver.begin(), kSmallTransolver.end());
  e = testing::run_slipstream(train, std::chrono::seconds(300));
  ASSERT_EQ(e.code, 0) << e.output;
  e = testing::run_slipstream({"infer", "--checkpoint", dir.file("runs/generated"), "--split",
                               "train", "--out", dir.file("infer"), "--device", "cpu"},
                              std::chrono::seconds(300));
  ASSERT_EQ(e.code, 0) << e.output;
  const auto steps = records(dir.file("infer/metrics.jsonl"), "infer_step");
  ASSERT_EQ(steps.size(), 1u);
  const auto& forces = steps[0]["forces"];
  const double cd = forces["cfd"]["CD"];
  EXPECT_GT(cd, 0.1);
  EXPECT_NEAR(forces["true"]["CD"].get<double>(), cd, 0.005 * cd) << steps[0].dump();
  EXPECT_NEAR(forces["true"]["CL"].get<double>(), forces["cfd"]["CL"].get<double>(), 0.01 * cd)
      << steps[0].dump();
  // The same case exported in DrivAerML's layout reads as the same surface
  // with the same forces.
  e = testing::run_slipstream({"prepare", "--in", dir.file("raw"), "--out", dir.file("raw_surface"),
                               "--val-fraction", "0", "dataset=ahmed_surface"},
                              std::chrono::seconds(300));
  ASSERT_EQ(e.code, 0) << e.output;
  e = testing::run_slipstream(
      {"infer", "--checkpoint", dir.file("runs/generated"), "--data", dir.file("raw_surface"),
       "--split", "train", "--out", dir.file("infer_raw"), "--device", "cpu"},
      std::chrono::seconds(300));
  ASSERT_EQ(e.code, 0) << e.output;
  const auto raw = records(dir.file("infer_raw/metrics.jsonl"), "infer_step");
  ASSERT_EQ(raw.size(), 1u);
  EXPECT_EQ(raw[0]["points"], steps[0]["points"]);
  for (const char* c : {"CD", "CL"}) {
    for (const char* which : {"true", "pred", "cfd"}) {
      EXPECT_NEAR(raw[0]["forces"][which][c].get<double>(), forces[which][c].get<double>(), 1e-6)
          << which << " " << c;
    }
  }
  // Resumable: a finished case is left as it is.
  e = testing::Process("/bin/bash", generate, env).wait(std::chrono::seconds(60));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_OUTPUT_HAS(e, "run_1: done earlier");
}

TEST(AhmedCfdTest, VolumeRunsGoThroughPrepareTrainAndInfer) {
  Chain chain;
  chain.prepare("ahmed_volume");
  for (const auto& [model, sizes] : {std::pair{"transolver_volume", kSmallTransolver},
                                     std::pair{"geotransolver_volume", kSmallGeoTransolver}}) {
    const auto steps = chain.train_and_infer(model, "ahmed_volume", sizes);
    ASSERT_EQ(steps.size(), 1u) << model;
    EXPECT_EQ(steps[0]["points"], 60000) << model;  // every fluid cell of the run
    for (const char* field : {"velocity_l2", "pressure_l2", "nut_l2"}) {
      ASSERT_TRUE(steps[0]["metrics"].contains(field)) << model << " " << field;
      EXPECT_TRUE(std::isfinite(steps[0]["metrics"][field].get<double>())) << model << field;
    }
  }
}

}  // namespace
}  // namespace slipstream::aero
