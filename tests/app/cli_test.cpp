// The slipstream executable as a user runs it: exit codes and messages for
// bad input, and the volume model's parameter count.
#include "core/distributed/process_group.h"
#include "support/multiprocess.h"
#include "support/test_support.h"

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <vector>

namespace slipstream {
namespace {

struct Run {
  int code;
  std::string output;
};

Run slipstream(const std::string& args) {
  const char* bin = std::getenv("SLIPSTREAM_BIN");
  const std::string cmd = std::string(bin ? bin : "slipstream") + " " + args + " 2>&1";
  Run r{0, ""};
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), p) != nullptr) r.output += buf.data();
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

const std::string kTiny =
    " model.n_layers=1 model.n_hidden=32 model.n_head=2 model.slice_num=8 dataset.num_train=2"
    " dataset.num_val=1 dataset.points_per_sample=400 dataset.sampling_resolution=128"
    " training.num_epochs=1 device=cpu ";

TEST(CliTest, InfoPrintsTheVolumeParameterCount) {
  const auto r = slipstream("info model=transolver_volume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("parameters: 8964709"), std::string::npos) << r.output;
}

TEST(CliTest, InfoPrintsTheGeoTransolverVolumeParameterCount) {
  const auto r = slipstream("info model=geotransolver_volume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("parameters: 27574449"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model: GeoTransolver"), std::string::npos) << r.output;
}

TEST(CliTest, InfoPrintsTheSurfaceParameterCounts) {
  const auto t = slipstream("info model=transolver_surface dataset=synthetic_surface");
  EXPECT_EQ(t.code, 0) << t.output;
  EXPECT_NE(t.output.find("parameters: 6021956"), std::string::npos) << t.output;
  const auto g = slipstream("info model=geotransolver_surface dataset=synthetic_surface");
  EXPECT_EQ(g.code, 0) << g.output;
  EXPECT_NE(g.output.find("parameters: 9046016"), std::string::npos) << g.output;
}

TEST(CliTest, ASurfaceModelOnAVolumeDatasetFailsNamingWhatToPick) {
  const auto r = slipstream("info model=transolver_surface dataset=synthetic");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("'normals'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dataset=synthetic_surface"), std::string::npos) << r.output;
}

TEST(CliTest, InfoDescribesAPhysicsNeMoCheckpointAndAnExportedOne) {
  const std::string mdlus = testing::fixtures_dir() + "/geotransolver_small_volume.mdlus";
  const auto r = slipstream("info --checkpoint " + mdlus);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("model: GeoTransolver"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"radii\":[0.2,0.6]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("parameters: 234367"), std::string::npos) << r.output;
  // Train a tiny Transolver, export it, describe the export.
  testing::TempDir dir;
  ASSERT_EQ(slipstream("train output_dir=" + dir.path() + " run_id=x" + kTiny).code, 0);
  const auto e =
      slipstream("export --checkpoint " + dir.path() + "/x --out " + dir.path() + "/x.mdlus");
  ASSERT_EQ(e.code, 0) << e.output;
  const auto ours = slipstream("info --checkpoint " + dir.path() + "/x");
  const auto exported = slipstream("info --checkpoint " + dir.path() + "/x.mdlus");
  ASSERT_EQ(exported.code, 0) << exported.output;
  auto tail = [](const std::string& s) { return s.substr(s.find("model: ")); };
  EXPECT_EQ(tail(ours.output), tail(exported.output));
  EXPECT_NE(exported.output.find("\"n_layers\":1"), std::string::npos) << exported.output;
  // infer with the export, the config from overrides; a wrong one is named.
  const std::string same =
      " model.n_layers=1 model.n_hidden=32 model.n_head=2 model.slice_num=8"
      " dataset.num_train=2 dataset.num_val=1 dataset.points_per_sample=400"
      " --device cpu";
  const auto inf = slipstream("infer --checkpoint " + dir.path() + "/x.mdlus --split val --out " +
                              dir.path() + "/pred" + same);
  ASSERT_EQ(inf.code, 0) << inf.output;
  std::ifstream records(dir.path() + "/pred/metrics.jsonl");
  const std::string jsonl((std::istreambuf_iterator<char>(records)), {});
  EXPECT_NE(jsonl.find("\"phase\":\"infer_summary\""), std::string::npos) << jsonl;
  const auto wrong = slipstream("infer --checkpoint " + dir.path() + "/x.mdlus --split val --out " +
                                dir.path() + "/p2" + same + " model.n_layers=3");
  EXPECT_NE(wrong.code, 0);
  EXPECT_NE(wrong.output.find("n_layers: 3 vs 1"), std::string::npos) << wrong.output;
  const auto bad = slipstream("info --checkpoint " + dir.path() + "/none.mdlus");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.output.find("none.mdlus' does not exist"), std::string::npos) << bad.output;
}

TEST(CliTest, VersionAndAMistypedCommandSayWhatTheyShould) {
  auto r = slipstream("--version");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("slipstream 0.", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("LibTorch "), std::string::npos) << r.output;
  r = slipstream("tran model=transolver_small");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("'tran' is not a command; did you mean 'train'?"), std::string::npos)
      << r.output;
  r = slipstream("--config-dir configs prepar --in x --out y");
  EXPECT_NE(r.output.find("did you mean 'prepare'?"), std::string::npos) << r.output;
  r = slipstream("frobnicate");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.output.find("did you mean"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(commands: train, bench"), std::string::npos) << r.output;
}

TEST(CliTest, TrainHelpListsTheModelAndDatasetChoices) {
  const auto r = slipstream("train --help");
  EXPECT_EQ(r.code, 0) << r.output;
  for (const char* want :
       {"model=geotransolver_small | geotransolver_surface", "transolver_volume",
        "dataset=ahmed_surface", "prepared_surface", "synthetic_volume", "run_id=NAME continues"}) {
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  }
}

TEST(CliTest, ConfigTypoFailsNamingTheKeyBeforeAnyWork) {
  testing::TempDir dir;
  const auto r = slipstream("train output_dir=" + dir.path() + " run_id=x training.nm_epochs=2");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("training.nm_epochs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("training.num_epochs"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/x"));
}

TEST(CliTest, MissingDatasetDirectoryFailsNamingIt) {
  testing::TempDir dir;
  const auto r = slipstream("train output_dir=" + dir.path() +
                            " run_id=x dataset.path=" + dir.path() + "/no-such-data");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("no-such-data"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/x/checkpoints"));
}

TEST(CliTest, MakeSyntheticThenTrainFromDiskAndFailOnATruncatedSample) {
  testing::TempDir dir;
  const std::string data = dir.path() + "/data";
  auto r = slipstream("make-synthetic --out " + data + kTiny);
  ASSERT_EQ(r.code, 0) << r.output;
  r = slipstream("train output_dir=" + dir.path() + " run_id=ok dataset.path=" + data + kTiny);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(
      std::filesystem::exists(dir.path() + "/ok/checkpoints/checkpoint_epoch_0001.safetensors"));

  const std::string victim = data + "/sample_00001.safetensors";
  std::filesystem::resize_file(victim, 100);
  r = slipstream("train output_dir=" + dir.path() + " run_id=bad dataset.path=" + data + kTiny);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find(victim), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/bad/checkpoints"));
}

TEST(CliTest, BenchDataTimesBothLayoutsAndLeavesNoFilesBehind) {
  testing::TempDir dir;
  const auto r = slipstream("bench-data --dir " + dir.path() +
                            " --sizes 50000 --keep 2000 --steps 2 --warmup 1 --whole-steps 1");
  ASSERT_EQ(r.code, 0) << r.output;
  std::set<std::string> layouts;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    const auto j = nlohmann::json::parse(line);
    layouts.insert(j["layout"].get<std::string>());
    EXPECT_EQ(j["points"], 50000);
    EXPECT_EQ(j["keep"], 2000);
    EXPECT_GT(j["step_ms_median"].get<double>(), 0.0);
  }
  EXPECT_EQ(layouts, (std::set<std::string>{"sampling", "v1"})) << r.output;
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  // A size at or below --keep is refused, naming both.
  const auto bad = slipstream("bench-data --dir " + dir.path() + " --sizes 1000 --keep 2000");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.output.find("size 1000 is not above --keep 2000"), std::string::npos) << bad.output;
}

// infer over domain-parallel ranks: `slipstream launch --nproc D -- infer`
// splits each sample's points over the D ranks (D not dividing them) and
// predicts what one process does, rank 0 writing: every infer_step metric
// within fp32 round-off, for Transolver and for GeoTransolver (whose ranks
// keep every point's coordinates for the neighbour search).
TEST(CliTest, InferOverDomainParallelRanksPredictsWhatOneProcessDoes) {
  if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
  testing::TempDir dir;
  const auto metrics = [](const std::string& jsonl) {
    std::vector<nlohmann::json> steps;
    for (const auto& line : testing::read_lines(jsonl)) {
      const auto j = nlohmann::json::parse(line);
      if (j["phase"] == "infer_step") steps.push_back(j["metrics"]);
    }
    return steps;
  };
  for (const std::string model : {"transolver", "geotransolver"}) {
    const std::string run = dir.path() + "/" + model;
    const std::string sizes = model == "transolver"
                                  ? kTiny
                                  : " model=geotransolver_small dataset.num_train=2"
                                    " dataset.num_val=2 dataset.points_per_sample=301"
                                    " dataset.sampling_resolution=128 training.num_epochs=1"
                                    " device=cpu ";
    const auto trained = slipstream("train output_dir=" + dir.path() + " run_id=" + model + sizes);
    ASSERT_EQ(trained.code, 0) << trained.output;
    const std::string infer = "infer --checkpoint " + run + " --split val --device cpu --out ";
    const auto one = slipstream(infer + run + "/one");
    ASSERT_EQ(one.code, 0) << one.output;
    const auto want = metrics(run + "/one/metrics.jsonl");
    ASSERT_FALSE(want.empty());
    for (const int ranks : {2, 3}) {
      const std::string out = run + "/ranks" + std::to_string(ranks);
      const auto r = slipstream("launch --nproc " + std::to_string(ranks) + " --port " +
                                std::to_string(testing::free_port()) + " -- " + infer + out);
      ASSERT_EQ(r.code, 0) << r.output;
      EXPECT_NE(r.output.find("over " + std::to_string(ranks) + " ranks"), std::string::npos)
          << r.output;
      const auto got = metrics(out + "/metrics.jsonl");
      ASSERT_EQ(got.size(), want.size()) << model << " " << ranks;
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_GT(want[i].size(), 3u);
        for (const auto& [key, v] : want[i].items()) {
          const double w = v.get<double>(), g = got[i].at(key).get<double>();
          EXPECT_NEAR(g, w, 1e-5 * std::abs(w) + 1e-9)
              << model << ", " << ranks << " ranks, sample " << i << " " << key;
        }
      }
    }
  }
}

}  // namespace
}  // namespace slipstream
