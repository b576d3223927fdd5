// A run a user can drive without reading the source, through the slipstream
// executable: Ctrl-C and the same command continue the run; progress says
// where the run is and how long is left; the run ends with a summary on the
// console and in summary.json (the best checkpoint kept, the commands to run
// next, the command line, version and commit); `eval` gives a split's
// metrics without writing meshes, the same as `infer`'s.
#include "support/process.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>

namespace slipstream {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::eventually;
using testing::Exit;
using testing::Process;
using testing::run_slipstream;

// A small, fast run on the CPU with no run_id (the default: a timestamp).
std::vector<std::string> small(const std::string& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"train"};
  for (auto& k : testing::quick_train_overrides(out)) o.push_back(std::move(k));
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

std::vector<std::string> run_dirs(const std::string& out) {
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator(out)) {
    if (e.is_directory()) dirs.push_back(e.path().string());
  }
  return dirs;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST(DriveTest, CtrlCThenTheSameCommandContinuesTheRun) {
  testing::TempDir dir;
  const auto command = small(dir.path(), {"training.num_epochs=1", "training.steps_per_epoch=400",
                                          "logging.console_every_n_steps=1000"});
  Process p(testing::slipstream_bin(), command);
  std::string run;
  ASSERT_TRUE(eventually(
      [&] {
        const auto dirs =
            fs::exists(dir.path()) ? run_dirs(dir.path()) : std::vector<std::string>{};
        if (dirs.size() != 1) return false;
        run = dirs.front();
        return testing::jsonl_records(run + "/metrics.jsonl", "phase", "train_step").size() >= 3;
      },
      30s))
      << p.output();
  p.signal(SIGINT);
  const Exit stopped = p.wait(30s);
  ASSERT_EQ(stopped.code, 130) << stopped.output;
  const std::string id = fs::path(run).filename().string();
  // One process stops after the step in progress, and says so.
  EXPECT_OUTPUT_HAS(stopped, "SIGINT: finishing the step in progress, then a checkpoint");
  EXPECT_OUTPUT_HAS(stopped, "the same command continues the run");
  EXPECT_OUTPUT_HAS(stopped, "run_id=" + id);
  const auto stop_summary = read_json(run + "/summary.json");
  EXPECT_EQ(stop_summary["status"], "stopped");
  EXPECT_EQ(stop_summary["signal"], "SIGINT");
  const int64_t stopped_at = stop_summary["global_step"].get<int64_t>();
  EXPECT_LT(stopped_at, 400);

  const Exit resumed = run_slipstream(command);
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_OUTPUT_HAS(resumed, "Continuing run '" + id + "'");
  EXPECT_EQ(run_dirs(dir.path()).size(), 1u) << resumed.output;
  // Every step once, the stopped ones not trained again.
  const auto steps = testing::jsonl_records(run + "/metrics.jsonl", "phase", "train_step");
  ASSERT_EQ(steps.size(), 400u);
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i]["global_step"], i);
  EXPECT_EQ(read_json(run + "/summary.json")["status"], "finished");

  // A finished run is not continued: the same command starts another.
  const Exit again =
      run_slipstream(small(dir.path(), {"training.num_epochs=1", "training.steps_per_epoch=400",
                                        "logging.console_every_n_steps=1000"}));
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_EQ(again.output.find("Continuing run"), std::string::npos) << again.output;
  EXPECT_EQ(run_dirs(dir.path()).size(), 2u);
}

TEST(DriveTest, ARunShowsProgressAndEndsWithASummaryOnTheConsoleAndInItsDirectory) {
  testing::TempDir dir;
  const Exit e =
      run_slipstream(small(dir.path(), {"run_id=s", "training.num_epochs=3", "training.keep_last=2",
                                        "logging.console_every_n_steps=1"}));
  ASSERT_EQ(e.code, 0) << e.output;
  // Progress: epoch k/N, elapsed<left, points a second, the data share, memory.
  EXPECT_OUTPUT_HAS(e, "Epoch 2/3 [3/6] ");
  EXPECT_OUTPUT_HAS(e, " pts/s Data: ");
  EXPECT_OUTPUT_HAS(e, "Validation 3/3 [2/2] ");
  EXPECT_OUTPUT_HAS(e, "Epoch 1/3 summary (");
  EXPECT_OUTPUT_HAS(e, "left for epochs 2-3");
  EXPECT_OUTPUT_HAS(e, "(losses, metrics: normalised)");
  const std::string run = dir.path() + "/s";
  const auto s = read_json(run + "/summary.json");
  EXPECT_EQ(s["status"], "finished");
  EXPECT_EQ(s["epochs_done"], 3);
  EXPECT_EQ(s["global_step"], 18);
  // The best epoch is the one of the lowest val loss the log holds.
  const auto val = testing::jsonl_records(run + "/metrics.jsonl", "phase", "val_summary");
  ASSERT_EQ(val.size(), 3u);
  int64_t best_epoch = 0;
  double best_loss = 1e300;
  for (const auto& v : val) {
    if (v["loss"].get<double>() < best_loss) {
      best_loss = v["loss"].get<double>();
      best_epoch = v["epoch"].get<int64_t>();
    }
  }
  ASSERT_TRUE(s["best"].is_object()) << s.dump(2);
  EXPECT_EQ(s["best"]["epoch"], best_epoch);
  EXPECT_DOUBLE_EQ(s["best"]["val_loss"].get<double>(), best_loss);
  EXPECT_EQ(s["best"]["checkpoint"], run + "/checkpoints/best.safetensors");
  EXPECT_TRUE(fs::exists(run + "/checkpoints/best.safetensors"));
  EXPECT_NE(s["last_checkpoint"].get<std::string>().find("checkpoint_epoch_0003"),
            std::string::npos);
  // How it was started.
  const auto& inv = s["invocation"];
  EXPECT_NE(inv["command_line"].get<std::string>().find("slipstream train "), std::string::npos);
  EXPECT_NE(inv["command_line"].get<std::string>().find("training.num_epochs=3"),
            std::string::npos);
  EXPECT_EQ(inv["overrides"].size(), 14u);
  EXPECT_FALSE(inv["version"].get<std::string>().empty());
  EXPECT_FALSE(inv["commit"].get<std::string>().empty());
  // The same record in the log, and the config's record carries the invocation too.
  EXPECT_EQ(testing::jsonl_records(run + "/metrics.jsonl", "phase", "run_summary").size(), 1u);
  EXPECT_EQ(testing::jsonl_records(run + "/metrics.jsonl", "phase", "config")
                .at(0)["invocation"]["command_line"],
            inv["command_line"]);
  // The console's summary names the best checkpoint and what to run next.
  EXPECT_OUTPUT_HAS(e, "Run s finished: 3 of 3 epochs done (step 18)");
  EXPECT_OUTPUT_HAS(e, "best:  val loss");
  EXPECT_OUTPUT_HAS(e, "slipstream eval --checkpoint " + run + "/checkpoints/best.safetensors");
  EXPECT_OUTPUT_HAS(e, "tensorboard --logdir " + run);
  EXPECT_OUTPUT_HAS(e, "Run directory: " + run);
  // info says where the best checkpoint's run stood, and what it predicts.
  const Exit info = run_slipstream({"info", "--checkpoint", run + "/checkpoints/best.safetensors"});
  ASSERT_EQ(info.code, 0) << info.output;
  EXPECT_OUTPUT_HAS(info, "position: " + std::to_string(best_epoch) + " of 3 epochs done");
  EXPECT_OUTPUT_HAS(info, ", val loss ");
  EXPECT_OUTPUT_HAS(info, "run: s, trained in fp32");
  EXPECT_OUTPUT_HAS(info, "\"pressure\"");
  // resolved_config.yaml names the run it belongs to.
  bool named = false;
  for (const auto& line : testing::read_lines(run + "/resolved_config.yaml")) {
    named |= line == "run_id: s";
  }
  EXPECT_TRUE(named);
}

TEST(DriveTest, EvalGivesTheMetricsInferGivesWithoutWritingMeshes) {
  testing::TempDir dir;
  const std::string data = dir.path() + "/data";
  ASSERT_EQ(run_slipstream({"make-synthetic", "--out", data, "dataset.num_train=3",
                            "dataset.num_val=2", "dataset.points_per_sample=400"})
                .code,
            0);
  const Exit trained = run_slipstream(
      small(dir.path() + "/runs", {"run_id=e", "training.num_epochs=1", "dataset.path=" + data}));
  ASSERT_EQ(trained.code, 0) << trained.output;
  const std::string run = dir.path() + "/runs/e";
  const Exit infer = run_slipstream({"infer", "--checkpoint", run, "--split", "val", "--out",
                                     dir.path() + "/infer", "--device", "cpu"});
  ASSERT_EQ(infer.code, 0) << infer.output;
  const Exit eval = run_slipstream({"eval", "--checkpoint", run, "--split", "val", "--out",
                                    dir.path() + "/eval", "--device", "cpu"});
  ASSERT_EQ(eval.code, 0) << eval.output;
  EXPECT_OUTPUT_HAS(eval, "Checkpoint: " + run + "/checkpoints/checkpoint_epoch_0001");
  EXPECT_OUTPUT_HAS(eval, "metrics in physical units:");
  const auto a =
      testing::jsonl_records(dir.path() + "/infer/metrics.jsonl", "phase", "infer_summary");
  const auto b =
      testing::jsonl_records(dir.path() + "/eval/metrics.jsonl", "phase", "infer_summary");
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_FALSE(a[0]["metrics"].empty());
  EXPECT_EQ(a[0]["metrics"], b[0]["metrics"]);
  // No meshes: only the records.
  for (const auto& e : fs::directory_iterator(dir.path() + "/eval")) {
    EXPECT_EQ(e.path().filename(), "metrics.jsonl") << e.path();
  }
  // Without --out it writes nothing and still prints the metrics.
  const Exit bare = run_slipstream({"eval", "--checkpoint", run, "--device", "cpu"});
  ASSERT_EQ(bare.code, 0) << bare.output;
  EXPECT_OUTPUT_HAS(bare, "split 'val': 2 samples");
  EXPECT_EQ(bare.output.find("Records:"), std::string::npos) << bare.output;
  const Exit wrong = run_slipstream({"eval", "--checkpoint", run, "--split", "valid"});
  EXPECT_EQ(wrong.code, 1) << wrong.output;
  EXPECT_OUTPUT_HAS(wrong, "valid");
}

TEST(DriveTest, AConfigTooLargeForTheMachineIsRefusedBeforeTheFirstStepWithTheEstimate) {
  testing::TempDir dir;
  // The recipe's volume config, 200k points a step, on this CPU: ~96 GiB.
  const Exit e = run_slipstream({"train", "model=transolver_volume", "dataset=synthetic_volume",
                                 "dataset.num_train=1", "dataset.num_val=1", "device=cpu",
                                 "output_dir=" + dir.path(), "run_id=m"});
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, "a step of 200000 points");
  EXPECT_OUTPUT_HAS(e, "needs about ");
  EXPECT_OUTPUT_HAS(e, "this machine has available");
  EXPECT_OUTPUT_HAS(e, "dataset.sampling_resolution");
  EXPECT_OUTPUT_HAS(e, "training.memory_check=false");
  EXPECT_TRUE(
      testing::jsonl_records(dir.path() + "/m/metrics.jsonl", "phase", "train_step").empty());
  // A small config says what it needs and trains.
  const Exit ok = run_slipstream(small(dir.path(), {"run_id=ok", "training.num_epochs=1"}));
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_OUTPUT_HAS(ok, "Memory: a step of 256 points needs about ");
}

}  // namespace
}  // namespace slipstream
