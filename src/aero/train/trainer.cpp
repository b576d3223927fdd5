#include "aero/train/trainer.h"

#include "aero/train/checkpoint.h"
#include "core/device/device.h"
#include "core/io/atomic_file.h"
#include "core/readback/step_means.h"
#include "core/sinks/console_sink.h"
#include "core/sinks/jsonl_sink.h"
#include "core/sinks/tensorboard_sink.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <iostream>

namespace slipstream::aero {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

FieldKind kind_of(const std::string& key) {
  if (key == "loss" || key.rfind("loss/", 0) == 0) return FieldKind::kLoss;
  return FieldKind::kMetric;
}

// The log record of one delivered step: its index fields, the device values,
// then the host fields (lr, step_time_s, mem_gb).
LogRecord step_log_record(const std::string& phase, const StepRecord& r, int64_t epoch,
                          int64_t index_in_epoch, int64_t steps, std::vector<Field> fields) {
  LogRecord rec;
  rec.kind = phase + "_step";
  rec.phase = phase;
  rec.tb_step = r.step;
  rec.epoch = epoch;
  rec.index_in_epoch = index_in_epoch;
  rec.steps_in_epoch = steps;
  rec.fields = std::move(fields);
  for (const auto& [k, v] : r.values) rec.fields.push_back({k, v, kind_of(k)});
  for (const auto& [k, v] : r.host) {
    rec.fields.push_back({k, v, k == "lr" ? FieldKind::kLearningRate : FieldKind::kPerformance});
  }
  return rec;
}

}  // namespace

Trainer::Trainer(Run& run) : run_(run) {}

Trainer::~Trainer() = default;

void Trainer::set_sync_audit(bool on) {
  audit_enabled_ = on;
  if (!on) audit_.stop();
}

StepReadback::Options Trainer::readback_options(const char* phase) const {
  StepReadback::Options ro;
  ro.policy = run_.settings().readback;
  ro.comm = run_.comm.get();
  ro.name = phase;
  return ro;
}

void Trainer::setup_logging() {
  if (run_.rank != 0 || logger_.sink_count() > 0) return;
  const auto& s = run_.settings();
  const std::string dir = s.run_dir();
  fs::create_directories(dir);
  write_file_atomically(dir + "/resolved_config.yaml", run_.config.to_yaml());
  logger_.add_sink(std::make_unique<ConsoleSink>(stdout, s.console_every_n_steps));
  logger_.add_sink(std::make_unique<JsonlSink>(dir + "/metrics.jsonl"));
  if (s.tensorboard) logger_.add_sink(std::make_unique<TensorBoardSink>(dir + "/tb"));
  const nlohmann::json config = run_.config_record();
  logger_.write_document("config", config);
  std::printf("Model: %s, %lld parameters, %s on %s, %s\n",
              config["model"].get<std::string>().c_str(),
              static_cast<long long>(config["num_parameters"].get<int64_t>()),
              to_string(run_.precision).c_str(), run_.device.str().c_str(),
              config["numerics"].dump().c_str());
  logger_.write_document("dataset", run_.dataset_record());
}

EpochResult Trainer::train_epoch(int64_t epoch) {
  setup_logging();
  const auto& s = run_.settings();
  const c10::Device device = run_.device;
  Model& model = *run_.model;
  model.train();
  const auto order = epoch_order(run_.data.train->size(), epoch, s.seed, s.shuffle, run_.rank,
                                 run_.world_size, /*drop_last=*/true);
  const int64_t steps =
      s.steps_per_epoch > 0 ? s.steps_per_epoch : static_cast<int64_t>(order.size());
  std::vector<size_t> epoch_samples;
  for (int64_t i = 0; i < steps; ++i) epoch_samples.push_back(order[i % order.size()]);
  LoaderOptions train_loader = run_.loader;
  train_loader.augment = true;
  PrefetchLoader loader(run_.data.train, std::move(epoch_samples), train_loader, epoch);
  reset_peak_memory(device);
  const int64_t first_step = global_step_;
  StepMeans means;
  StepReadback readback(
      [&](const StepRecord& r) {
        means.add(r.values);
        if (run_.rank != 0) return;
        logger_.write(
            step_log_record("train", r, epoch, r.step - first_step + 1, steps,
                            {{"global_step", static_cast<double>(r.step), FieldKind::kIndex},
                             {"epoch", static_cast<double>(epoch), FieldKind::kIndex}}));
      },
      readback_options("train"));
  step_times_.clear();
  if (audit_enabled_ && !audit_.active()) audit_available_ = audit_.start();
  auto phase = [&](Phase p) {
    if (audit_.active()) audit_.set_phase(p);
  };
  const auto epoch_t0 = Clock::now();
  {
    ReadbackScope scope(readback);
    for (int64_t i = 0; i < steps; ++i) {
      const auto t0 = Clock::now();
      if (step_hook_) step_hook_(i);
      // Steps 0 and 1 allocate and warm caches; the audit counts from step 2.
      if (audit_.active() && i >= 2) audit_.begin_steady_step();
      phase(Phase::kLoader);
      Batch batch = loader.next();
      torch::Tensor prediction;
      {
        phase(Phase::kForward);
        AutocastGuard autocast(device, run_.bf16());
        prediction = model.forward(batch.inputs);
      }
      phase(Phase::kLoss);
      LossResult result = run_.loss->compute(prediction, batch.target, batch.weights);
      phase(Phase::kBackward);
      run_.optimizer->zero_grad();
      if (run_.averager) run_.averager->prepare();
      result.total.backward();
      if (run_.averager) run_.averager->finish();
      phase(Phase::kOptimizer);
      const double lr = run_.optimizer->lr();
      run_.optimizer->step();
      const double step_time = seconds_since(t0);
      step_times_.push_back(step_time);
      phase(Phase::kReadback);
      readback.start(
          global_step_, result.scalars,
          {{"lr", lr}, {"step_time_s", step_time}, {"mem_gb", memory_reserved_gib(device)}});
      ++global_step_;
      if (s.scheduler_per_step) run_.optimizer->set_lr(scheduled_lr(s, global_step_));
      phase(Phase::kLogging);
      readback.deliver_landed();
      if (audit_.active()) audit_.end_steady_step();
    }
    phase(Phase::kOther);
    readback.drain();
  }
  return finish_epoch("train", epoch, steps, seconds_since(epoch_t0), means.means());
}

EpochResult Trainer::val_epoch(int64_t epoch) {
  setup_logging();
  const auto& s = run_.settings();
  Model& model = *run_.model;
  model.eval();
  torch::NoGradGuard no_grad;
  const auto order = epoch_order(run_.data.val->size(), epoch, s.seed, /*shuffle=*/false, run_.rank,
                                 run_.world_size, /*drop_last=*/false);
  const int64_t steps = static_cast<int64_t>(order.size());
  // The same points every epoch, so that val losses compare across epochs.
  PrefetchLoader loader(run_.data.val, order, run_.loader, /*epoch=*/0);
  StepMeans means;
  const int64_t first = val_step_;
  StepReadback readback(
      [&](const StepRecord& r) {
        means.add(r.values);
        if (run_.rank != 0) return;
        logger_.write(step_log_record(
            "val", r, epoch, r.step - first + 1, steps,
            {{"epoch", static_cast<double>(epoch), FieldKind::kIndex},
             {"val_step", static_cast<double>(r.step - first), FieldKind::kIndex}}));
      },
      readback_options("val"));
  const auto epoch_t0 = Clock::now();
  {
    ReadbackScope scope(readback);
    for (int64_t i = 0; i < steps; ++i) {
      const auto t0 = Clock::now();
      Batch batch = loader.next();
      torch::Tensor prediction;
      {
        AutocastGuard autocast(run_.device, run_.bf16());
        prediction = model.forward(batch.inputs);
      }
      LossResult result = run_.loss->compute(prediction, batch.target, batch.weights);
      readback.start(val_step_++, result.scalars, {{"step_time_s", seconds_since(t0)}});
      readback.deliver_landed();
    }
    readback.drain();
  }
  return finish_epoch("val", epoch, steps, seconds_since(epoch_t0), means.means());
}

EpochResult Trainer::finish_epoch(const char* phase, int64_t epoch, int64_t steps, double seconds,
                                  const std::map<std::string, double>& means) {
  EpochResult r{epoch, steps, seconds, peak_memory_gib(run_.device), means};
  if (run_.comm && run_.world_size > 1) {
    // The epoch summary may block: the largest peak over ranks.
    auto t = torch::full({1}, r.peak_memory_gib,
                         torch::TensorOptions().dtype(torch::kDouble).device(run_.device));
    run_.comm->all_reduce_max(t);
    r.peak_memory_gib = t.item<double>();
  }
  if (run_.rank != 0) return r;
  LogRecord rec;
  rec.kind = std::string(phase) + "_summary";
  rec.phase = phase;
  rec.per_step = false;
  rec.tb_step = r.epoch;
  rec.epoch = r.epoch;
  rec.fields.push_back({"epoch", static_cast<double>(r.epoch), FieldKind::kIndex});
  for (const auto& key : run_.loss->keys()) {
    auto it = r.means.find(key);
    if (it != r.means.end()) rec.fields.push_back({key, it->second, kind_of(key)});
  }
  if (std::string(phase) == "train") {
    rec.fields.push_back({"lr", run_.optimizer->lr(), FieldKind::kLearningRate});
  }
  rec.fields.push_back({"epoch_seconds", r.seconds, FieldKind::kPerformance});
  rec.fields.push_back({"steps", static_cast<double>(r.steps), FieldKind::kPerformance});
  rec.fields.push_back({"peak_memory_gib", r.peak_memory_gib, FieldKind::kPerformance});
  logger_.write(rec);
  return r;
}

std::string Trainer::sync_audit_report() const {
  if (!audit_available_) {
    return "Sync audit: not available (this build has no CUDA; nothing was counted)\n";
  }
  return audit_.report();
}

TrainResult Trainer::fit() {
  setup_logging();
  const auto& s = run_.settings();
  TrainResult result;
  result.run_dir = s.run_dir();
  const std::string ckpt_dir = s.run_dir() + "/checkpoints";
  int64_t start_epoch = 0;
  if (s.resume) {
    if (auto info = load_newest_checkpoint(ckpt_dir, run_.model.get(), run_.optimizer.get())) {
      start_epoch = info->epoch;
      global_step_ = info->global_step;
      if (run_.rank == 0) {
        std::cout << "Resumed from " << info->path << " (epoch " << info->epoch << ", step "
                  << info->global_step << ")\n";
      }
    }
  }
  result.start_epoch = start_epoch;
  for (int64_t epoch = start_epoch + 1; epoch <= s.num_epochs; ++epoch) {
    if (!s.scheduler_per_step) run_.optimizer->set_lr(scheduled_lr(s, epoch - 1));
    result.train.push_back(train_epoch(epoch));
    if (s.validate && run_.data.val->size() > 0) result.val.push_back(val_epoch(epoch));
    if (run_.rank == 0) logger_.end_epoch(epoch);
    if (run_.rank == 0 && (epoch % s.save_interval == 0 || epoch == s.num_epochs)) {
      save_checkpoint(ckpt_dir, epoch, global_step_, *run_.model, *run_.optimizer,
                      run_.checkpoint_metadata());
    }
  }
  logger_.flush();
  return result;
}

}  // namespace slipstream::aero
