// The trainer end to end on CPU: every step logged once, in order, with its
// own lr; TensorBoard files that read back; checkpoints and resume; and an
// exception mid-epoch that logs the landed steps and propagates.
#include "aero/train/trainer.h"
#include "aero/run/checkpoint.h"
#include "aero/train/step_guard.h"
#include "core/sinks/event_file_writer.h"
#include "support/recipe_support.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <thread>

namespace slipstream::aero {
namespace {

namespace fs = std::filesystem;

// A small, fast run on the CPU: 2 epochs of 3 steps of a 1-layer model.
std::vector<std::string> tiny(const std::string& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = testing::quick_train_overrides(out);
  for (const char* k : {"training.num_epochs=2", "run_id=r", "logging.console_every_n_steps=100"}) {
    o.emplace_back(k);
  }
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

// A run and its trainer, built once from the overrides.
struct Fixture {
  std::unique_ptr<Run> run;
  std::unique_ptr<Trainer> trainer;
  explicit Fixture(const std::vector<std::string>& overrides)
      : run(build_run(testing::load_config(overrides), DistributedEnv{})),
        trainer(std::make_unique<Trainer>(*run)) {}
  Trainer* operator->() { return trainer.get(); }
};

// The records of one phase, read as the recipe's tools read metrics.jsonl.
std::vector<nlohmann::json> records(const std::string& path, const std::string& phase) {
  std::vector<nlohmann::json> out;
  for (const auto& line : testing::read_lines(path)) {
    auto j = nlohmann::json::parse(line);
    if (j["phase"] == phase) out.push_back(j);
  }
  return out;
}

// A dataset that takes `delay` to hand out each sample: a slow disk.
class SlowDataset : public Dataset {
 public:
  SlowDataset(std::shared_ptr<Dataset> inner, std::chrono::milliseconds delay)
      : inner_(std::move(inner)), delay_(delay) {}
  using Dataset::get;
  size_t size() const override { return inner_->size(); }
  Sample get(size_t index) const override {
    std::this_thread::sleep_for(delay_);
    return inner_->get(index);
  }
  std::string describe() const override { return inner_->describe(); }
  SampleLayout layout() const override { return inner_->layout(); }

 private:
  std::shared_ptr<Dataset> inner_;
  std::chrono::milliseconds delay_;
};

// Two ranks' control scalars, delivered as the readback delivers them (the
// all-rank mean of each): a NaN loss on one rank names that rank alone,
// though the averaged gradients are NaN on both; NaN gradients under finite
// losses name no rank.
std::string guard_report(const std::vector<double>& losses, bool nan_gradients) {
  const int world = static_cast<int>(losses.size());
  std::map<std::string, double> sums;
  std::vector<std::string> order;
  for (int rank = 0; rank < world; ++rank) {
    const StepGuard guard(rank, world, /*lag=*/2);
    StepScalars scalars;
    scalars.add("loss", torch::full({}, losses[static_cast<size_t>(rank)]));
    std::vector<torch::Tensor> grads{torch::ones({3}) * (nan_gradients ? NAN : 1.0f)};
    guard.add_controls(scalars, torch::full({}, losses[static_cast<size_t>(rank)]), grads, false);
    for (const auto& e : scalars.entries()) {
      if (!sums.count(e.key)) order.push_back(e.key);
      sums[e.key] += e.value.item<double>();
    }
  }
  StepRecord record;
  record.step = 7;
  for (const auto& key : order) record.values.emplace_back(key, sums[key] / world);
  StepGuard observer(0, world, /*lag=*/2);
  observer.observe(record);
  EXPECT_EQ(record.values.size(), 1u);  // the controls are taken out of what is logged
  try {
    observer.throw_if_nonfinite();
  } catch (const NonFiniteError& e) {
    EXPECT_TRUE(observer.stop_after(9));
    return e.what();
  }
  return "";
}

TEST(TrainerTest, ANonFiniteLossNamesTheRankWhoseLossItWasNotEveryRank) {
  const std::string one = guard_report({NAN, 0.5}, /*nan_gradients=*/true);
  EXPECT_NE(one.find("train: step 7: non-finite loss on rank 0;"), std::string::npos) << one;
  const std::string other = guard_report({0.5, 0.25, INFINITY}, true);
  EXPECT_NE(other.find("non-finite loss on rank 2;"), std::string::npos) << other;
  const std::string both = guard_report({NAN, NAN}, true);
  EXPECT_NE(both.find("on ranks 0, 1"), std::string::npos) << both;
  const std::string gradients = guard_report({0.5, 0.25}, true);
  EXPECT_NE(gradients.find("non-finite gradients (every rank's loss is finite"), std::string::npos)
      << gradients;
  EXPECT_EQ(gradients.find("rank 0"), std::string::npos) << gradients;
  EXPECT_NE(guard_report({0.5}, true).find("non-finite gradients on rank 0 (its loss is finite)"),
            std::string::npos);
  EXPECT_EQ(guard_report({0.5, 0.25}, false), "");
}

TEST(TrainerTest, AStarvedStepShowsItsWaitForDataInTheLogs) {
  testing::TempDir dir;
  {
    Fixture t(tiny(dir.path(), {"training.num_epochs=1", "training.validate=false"}));
    t.run->data.train =
        std::make_shared<SlowDataset>(t.run->data.train, std::chrono::milliseconds(250));
    t->fit();
  }
  const std::string metrics = dir.path() + "/r/metrics.jsonl";
  const auto steps = records(metrics, "train_step");
  ASSERT_EQ(steps.size(), 6u);
  double waited = 0;
  for (const auto& step : steps) waited += step["data_time_s"].get<double>();
  // Six samples at 250 ms each, read one at a time by the loader's thread:
  // the steps, a few ms of work each, waited for most of the 1.5 s.
  EXPECT_GT(waited, 0.75) << waited;
  const auto summary = records(metrics, "train_summary").at(0);
  EXPECT_NEAR(summary["data_time_s"].get<double>(), waited, 1e-6);
  EXPECT_GT(summary["data_wait_share"].get<double>(), 0.4) << summary.dump();
}

TEST(TrainerTest, TheNextEpochsFirstSampleLoadsWhileThisEpochValidates) {
  testing::TempDir dir;
  {
    Fixture t(tiny(dir.path(), {"training.num_epochs=2", "dataset.num_workers=1"}));
    const auto delay = std::chrono::milliseconds(250);
    t.run->data.train = std::make_shared<SlowDataset>(t.run->data.train, delay);
    t.run->data.val = std::make_shared<SlowDataset>(t.run->data.val, delay);
    t->fit();
  }
  const auto steps = records(dir.path() + "/r/metrics.jsonl", "train_step");
  ASSERT_EQ(steps.size(), 12u);
  // Epoch 1's first step waits for its sample; epoch 2's was read during
  // epoch 1's validation (two samples, 250 ms each).
  EXPECT_GT(steps[0]["data_time_s"].get<double>(), 0.2) << steps[0].dump();
  EXPECT_LT(steps[6]["data_time_s"].get<double>(), 0.1) << steps[6].dump();
}

// A dataset whose sample 0 has NaN pressures: its val loss is not finite.
class NaNTargetDataset : public Dataset {
 public:
  explicit NaNTargetDataset(std::shared_ptr<Dataset> inner) : inner_(std::move(inner)) {}
  using Dataset::get;
  size_t size() const override { return inner_->size(); }
  Sample get(size_t index) const override {
    Sample s = inner_->get(index);
    if (index == 0) {
      s.point_data["pressure"] = s.point("pressure").clone();
      s.point_data["pressure"].fill_(NAN);  // whatever rows a step keeps
    }
    return s;
  }
  std::string describe() const override { return inner_->describe(); }
  SampleLayout layout() const override { return inner_->layout(); }

 private:
  std::shared_ptr<Dataset> inner_;
};

TEST(TrainerTest, AValStepWithANonFiniteLossIsCountedInTheSummaryNotDroppedSilently) {
  testing::TempDir dir;
  {
    Fixture t(tiny(dir.path(), {"training.num_epochs=1"}));
    t.run->data.val = std::make_shared<NaNTargetDataset>(t.run->data.val);
    ::testing::internal::CaptureStderr();
    t->fit();
    const std::string said = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(said.find("1 of 2 steps had a non-finite loss"), std::string::npos) << said;
  }
  const auto summary = records(dir.path() + "/r/metrics.jsonl", "val_summary").at(0);
  EXPECT_EQ(summary["nonfinite_steps"].get<double>(), 1.0) << summary.dump();
  EXPECT_TRUE(std::isfinite(summary["loss"].get<double>()));
}

TEST(TrainerTest, LogsEveryStepOnceInOrderAndResumes) {
  testing::TempDir dir;
  {
    Fixture t(tiny(dir.path()));
    const auto result = t->fit();
    ASSERT_EQ(result.train.size(), 2u);
    ASSERT_EQ(result.val.size(), 2u);
  }
  const std::string run = dir.path() + "/r";
  auto steps = records(run + "/metrics.jsonl", "train_step");
  ASSERT_EQ(steps.size(), 12u);
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(steps[i]["global_step"], i);
    EXPECT_TRUE(steps[i].contains("lr"));
    EXPECT_GT(steps[i]["step_time_s"].get<double>(), 0.0);
    // The host's wait for the batch, a part of the step's time.
    EXPECT_GE(steps[i]["data_time_s"].get<double>(), 0.0);
    EXPECT_LE(steps[i]["data_time_s"].get<double>(), steps[i]["step_time_s"].get<double>());
    EXPECT_TRUE(steps[i].contains("loss/velocity"));
    EXPECT_TRUE(steps[i].contains("pressure_l2"));
    EXPECT_TRUE(std::isfinite(steps[i]["loss"].get<double>()));
  }
  EXPECT_EQ(records(run + "/metrics.jsonl", "val_step").size(), 4u);
  EXPECT_EQ(records(run + "/metrics.jsonl", "train_summary").size(), 2u);
  auto summary = records(run + "/metrics.jsonl", "train_summary")[0];
  EXPECT_TRUE(summary.contains("epoch_seconds"));
  EXPECT_TRUE(summary.contains("peak_memory_gib"));
  EXPECT_LE(summary["data_time_s"].get<double>(), summary["epoch_seconds"].get<double>());
  EXPECT_GE(summary["data_wait_share"].get<double>(), 0.0);
  EXPECT_LE(summary["data_wait_share"].get<double>(), 1.0);
  EXPECT_TRUE(fs::exists(run + "/resolved_config.yaml"));
  // The recipe's config record: model, num_parameters, params (flattened);
  // and which physics-attention path ran (the fused kernels need CUDA, bf16).
  const auto config = records(run + "/metrics.jsonl", "config");
  ASSERT_EQ(config.size(), 1u);
  EXPECT_EQ(config[0]["model"], "Transolver");
  EXPECT_GT(config[0]["num_parameters"].get<int64_t>(), 0);
  EXPECT_EQ(config[0]["params"]["model.n_hidden"], "32");
  EXPECT_EQ(config[0]["precision"], "fp32");
  EXPECT_EQ(config[0]["numerics"]["physics_attention"], "plain LibTorch");
  EXPECT_EQ(config[0]["numerics"]["layer_norm"], "fp32");  // bf16 only under CUDA autocast
  // The recipe's dataset record.
  const auto dataset = records(run + "/metrics.jsonl", "dataset");
  ASSERT_EQ(dataset.size(), 1u);
  EXPECT_EQ(dataset[0]["train_samples"], 6);
  EXPECT_EQ(dataset[0]["val_samples"], 2);
  EXPECT_EQ(dataset[0]["dataset_size"], 8);
  EXPECT_EQ(dataset[0]["targets"]["velocity"], "vector");
  EXPECT_EQ(dataset[0]["targets"]["nut"], "scalar");

  // TensorBoard: every train step's scalars, read back with CRC checks.
  std::vector<std::string> tb_files;
  for (const auto& e : fs::directory_iterator(run + "/tb/train")) tb_files.push_back(e.path());
  ASSERT_EQ(tb_files.size(), 1u);
  const auto events = read_event_file(tb_files[0]);
  int64_t step_events = 0;
  for (const auto& ev : events) {
    for (const auto& [tag, v] : ev.scalars) {
      if (tag == "iteration/loss/total") {
        EXPECT_EQ(ev.step, step_events++);
      }
    }
  }
  EXPECT_EQ(step_events, 12);
  ASSERT_FALSE(fs::is_empty(run + "/tb/val"));

  // Checkpoints, then resume into a third epoch.
  EXPECT_EQ(list_checkpoints(run + "/checkpoints").size(), 2u);
  {
    Fixture t(tiny(dir.path(), {"training.num_epochs=3"}));
    const auto result = t->fit();
    EXPECT_EQ(result.start_epoch, 2);
    EXPECT_EQ(result.train.size(), 1u);
  }
  steps = records(run + "/metrics.jsonl", "train_step");
  ASSERT_EQ(steps.size(), 18u);
  for (int i = 0; i < 18; ++i) EXPECT_EQ(steps[i]["global_step"], i);
  for (const auto& e : fs::recursive_directory_iterator(run)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos)
        << "temp file left behind: " << e.path();
  }
}

TEST(TrainerTest, GeoTransolverTrainsThroughTheSameTrainerAndItsLossFalls) {
  testing::TempDir dir;
  {
    Fixture t({"model=geotransolver_small", "dataset.num_train=6", "dataset.num_val=2",
               "dataset.points_per_sample=600", "dataset.sampling_resolution=256",
               "training.num_epochs=3", "output_dir=" + dir.path(), "run_id=g",
               "logging.console_every_n_steps=100", "device=cpu", "optimizer.lr=0.003"});
    EXPECT_EQ(t.run->shape.input_widths.at("local_embedding"), 7);
    EXPECT_EQ(t.run->model->class_name(), "GeoTransolver");
    t->fit();
  }
  const auto summaries = records(dir.path() + "/g/metrics.jsonl", "train_summary");
  ASSERT_EQ(summaries.size(), 3u);
  EXPECT_LT(summaries[2]["loss"].get<double>(), summaries[0]["loss"].get<double>());
  const auto config = records(dir.path() + "/g/metrics.jsonl", "config");
  EXPECT_EQ(config[0]["model"], "GeoTransolver");
}

TEST(TrainerTest, EachStepLogsTheLearningRateOfItsOwnStep) {
  testing::TempDir dir;
  Fixture t(
      tiny(dir.path(), {"training.num_epochs=1", "scheduler.interval=step", "scheduler.step_size=1",
                        "scheduler.gamma=0.5", "training.validate=false"}));
  t->fit();
  const auto steps = records(dir.path() + "/r/metrics.jsonl", "train_step");
  ASSERT_EQ(steps.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_DOUBLE_EQ(steps[i]["lr"].get<double>(), 0.001 * std::pow(0.5, i)) << "step " << i;
  }
}

TEST(TrainerTest, AnExceptionMidEpochLogsTheLandedStepsAndPropagates) {
  testing::TempDir dir;
  Fixture t(tiny(dir.path(), {"training.num_epochs=1"}));
  t->set_step_hook([](int64_t i) {
    if (i == 4) throw std::runtime_error("simulated out of memory at step 4");
  });
  EXPECT_THROW(t->fit(), std::runtime_error);
  const auto steps = records(dir.path() + "/r/metrics.jsonl", "train_step");
  ASSERT_EQ(steps.size(), 4u);  // on CPU every earlier step has landed
  for (int i = 0; i < 4; ++i) EXPECT_EQ(steps[i]["global_step"], i);
  EXPECT_TRUE(list_checkpoints(dir.path() + "/r/checkpoints").empty());
}

TEST(TrainerTest, BlockingAndAsyncReadbackLogTheSameValues) {
  std::vector<std::vector<nlohmann::json>> runs;
  for (const std::string policy : {"async", "blocking"}) {
    testing::TempDir dir;
    Fixture t(tiny(dir.path(), {"training.num_epochs=1", "training.validate=false",
                                "training.readback=" + policy}));
    t->fit();
    runs.push_back(records(dir.path() + "/r/metrics.jsonl", "train_step"));
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (size_t i = 0; i < runs[0].size(); ++i) {
    for (const std::string key : {"loss", "loss/pressure", "velocity_x_l2", "nut_mae"}) {
      EXPECT_EQ(runs[0][i][key].get<double>(), runs[1][i][key].get<double>())
          << key << " step " << i;
    }
  }
}

// training.recompute reaches the model: the same training, step for step,
// bitwise on the CPU for Transolver (256 points a step: one chunk); for
// GeoTransolver the first step's values bitwise and the later ones to
// round-off (its context's gradient is summed over the blocks in another
// order), amplified by AdamW's first, sign-like updates.
TEST(TrainerTest, RecomputeTrainsTheSameSteps) {
  for (const bool geo : {false, true}) {
    std::vector<std::vector<nlohmann::json>> runs;
    for (const std::string mode : {"none", "block", "attention"}) {
      testing::TempDir dir;
      std::vector<std::string> extra{"training.num_epochs=1", "training.validate=false",
                                     "training.recompute=" + mode};
      auto overrides = tiny(dir.path(), extra);
      if (geo) {
        overrides = {"model=geotransolver_small",
                     "dataset.num_train=3",
                     "dataset.num_val=0",
                     "dataset.points_per_sample=300",
                     "dataset.sampling_resolution=256",
                     "output_dir=" + dir.path(),
                     "run_id=r",
                     "device=cpu"};
        overrides.insert(overrides.end(), extra.begin(), extra.end());
      }
      Fixture t(overrides);
      t->fit();
      runs.push_back(records(dir.path() + "/r/metrics.jsonl", "train_step"));
    }
    for (size_t r = 1; r < runs.size(); ++r) {
      ASSERT_EQ(runs[r].size(), runs[0].size());
      ASSERT_GE(runs[0].size(), 3u);
      for (size_t i = 0; i < runs[0].size(); ++i) {
        for (const std::string key : {"loss", "loss/pressure", "velocity_x_l2"}) {
          const double got = runs[r][i][key].get<double>(), want = runs[0][i][key].get<double>();
          const std::string what = (geo ? "GeoTransolver " : "Transolver ") + key + " step " +
                                   std::to_string(i) + " run " + std::to_string(r);
          if (!geo || i == 0) {
            EXPECT_EQ(got, want) << what;
          } else {
            EXPECT_NEAR(got, want, 2e-3 * std::abs(want)) << what;
          }
        }
      }
    }
  }
  testing::TempDir dir;
  EXPECT_NE(testing::error_message_of([&] {
              Fixture t(tiny(dir.path(), {"training.recompute=all"}));
            }).find("not one of none, attention, block"),
            std::string::npos);
}

// training.cuda_graph on the CPU: auto and false train eagerly (no capture),
// true is an error that names the key and the device, and a bad value names
// the key.
TEST(TrainerTest, CudaGraphsAreOnlyForCudaAndSayWhy) {
  for (const std::string mode : {"auto", "false"}) {
    testing::TempDir dir;
    Fixture t(tiny(dir.path(), {"training.cuda_graph=" + mode, "training.validate=false"}));
    const auto r = t->train_epoch(1);
    EXPECT_GT(r.steps, 1) << mode;
    EXPECT_EQ(r.graph_captures, 0) << mode;
  }
  testing::TempDir dir;
  Fixture t(tiny(dir.path(), {"training.cuda_graph=true"}));
  const auto msg = testing::error_message_of([&] { t->train_epoch(1); });
  EXPECT_NE(msg.find("training.cuda_graph=true"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
  const auto bad = testing::error_message_of(
      [&] { Fixture(tiny(dir.path(), {"training.cuda_graph=sometimes"})); });
  EXPECT_NE(bad.find("training.cuda_graph"), std::string::npos) << bad;
  EXPECT_NE(bad.find("sometimes"), std::string::npos) << bad;
}

}  // namespace
}  // namespace slipstream::aero
