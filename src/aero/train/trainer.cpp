#include "aero/train/trainer.h"

#include "aero/device/device.h"
#include "aero/model/slice_ops.h"
#include "aero/train/checkpoint.h"
#include "core/readback/step_readback.h"
#include "core/sinks/console_sink.h"
#include "core/sinks/jsonl_sink.h"
#include "core/sinks/tensorboard_sink.h"
#include "core/io/safetensors.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>

namespace slipstream::aero {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

nlohmann::json yaml_to_json(const YAML::Node& n) {
  if (n.IsMap()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& kv : n) j[kv.first.as<std::string>()] = yaml_to_json(kv.second);
    return j;
  }
  if (n.IsSequence()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& v : n) j.push_back(yaml_to_json(v));
    return j;
  }
  if (!n.IsDefined() || n.IsNull()) return nullptr;
  bool b;
  int64_t i;
  double d;
  if (YAML::convert<bool>::decode(n, b)) return b;
  if (YAML::convert<int64_t>::decode(n, i)) return i;
  if (YAML::convert<double>::decode(n, d)) return d;
  return n.as<std::string>();
}

// Means of the epoch's delivered step values (NaN steps left out).
struct Accumulator {
  std::map<std::string, std::pair<double, int64_t>> sums;
  std::vector<std::string> order;
  void add(const NamedValues& values) {
    for (const auto& [k, v] : values) {
      auto [it, inserted] = sums.try_emplace(k, 0.0, 0);
      if (inserted) order.push_back(k);
      if (std::isfinite(v)) {
        it->second.first += v;
        it->second.second += 1;
      }
    }
  }
  std::map<std::string, double> means() const {
    std::map<std::string, double> out;
    for (const auto& [k, s] : sums) {
      out[k] = s.second > 0 ? s.first / static_cast<double>(s.second)
                            : std::numeric_limits<double>::quiet_NaN();
    }
    return out;
  }
};

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

StepReadback::Options Trainer::readback_options(const char* phase) const {
  StepReadback::Options ro;
  ro.policy = settings_.readback;
  ro.comm = comm_;
  ro.name = phase;
  return ro;
}

Trainer::Trainer(TrainSettings settings, std::string config_yaml, Communicator* comm,
                 int local_rank)
    : settings_(std::move(settings)),
      config_yaml_(std::move(config_yaml)),
      comm_(comm),
      device_(resolve_device(settings_.device, local_rank)) {
  if (comm_ != nullptr) {
    rank_ = comm_->rank();
    world_ = comm_->world_size();
  }
  bf16_ = settings_.precision == "bf16" || (settings_.precision == "auto" && device_.is_cuda());
  TORCH_CHECK(!(bf16_ && !device_.is_cuda()),
              "config: precision 'bf16' needs a CUDA device (CPU runs in fp32)");
  // Data first: a missing or broken dataset fails before anything is written.
  if (settings_.dataset_path.empty()) {
    data_.train = std::make_shared<SyntheticDataset>(settings_.synthetic, 0, settings_.num_train,
                                                     settings_.targets);
    data_.val = std::make_shared<SyntheticDataset>(settings_.synthetic, settings_.num_train,
                                                   settings_.num_val, settings_.targets);
  } else {
    data_ = open_sample_directory(settings_.dataset_path, settings_.targets);
  }
  TORCH_CHECK(data_.train->size() >= static_cast<size_t>(world_), "dataset: ",
              data_.train->size(), " train samples cannot feed ", world_, " ranks");
  torch::manual_seed(settings_.seed);
  model_ = Transolver(settings_.model);
  model_->to(device_);
  if (comm_ != nullptr && world_ > 1) {
    check_same_config_on_every_rank();
    // One run directory for all ranks: rank 0's run_id (a timestamp when unset).
    auto id = torch::zeros({64}, torch::TensorOptions().dtype(torch::kLong).device(device_));
    if (rank_ == 0) {
      TORCH_CHECK(settings_.run_id.size() < 64, "config: run_id longer than 63 characters");
      auto host = torch::zeros({64}, torch::kLong);
      for (size_t i = 0; i < settings_.run_id.size(); ++i) host[i] = settings_.run_id[i];
      id.copy_(host);
    }
    comm_->broadcast(id, 0);
    const auto host_id = id.cpu();
    std::string run_id;
    for (int64_t i = 0; i < 64 && host_id[i].item<int64_t>() != 0; ++i) {
      run_id.push_back(static_cast<char>(host_id[i].item<int64_t>()));
    }
    settings_.run_id = run_id;
    torch::NoGradGuard no_grad;
    for (auto& p : model_->parameters()) {
      auto t = p.detach();
      comm_->broadcast(t, 0);
    }
    averager_ = std::make_unique<GradientAverager>(model_->parameters(), comm_);
  }
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& p : model_->named_parameters()) named.emplace_back(p.key(), p.value());
  optimizer_ = std::make_unique<MuonAdamW>(named, settings_.optimizer);
  loss_ = std::make_unique<LossCalculator>(settings_.loss);
}

Trainer::~Trainer() = default;

void Trainer::setup_logging() {
  if (rank_ != 0 || logger_.sink_count() > 0) return;
  const std::string dir = settings_.run_dir();
  fs::create_directories(dir);
  write_file_atomically(dir + "/resolved_config.yaml", config_yaml_);
  logger_.add_sink(std::make_unique<ConsoleSink>(stdout, settings_.console_every_n_steps));
  logger_.add_sink(std::make_unique<JsonlSink>(dir + "/metrics.jsonl"));
  if (settings_.tensorboard) logger_.add_sink(std::make_unique<TensorBoardSink>(dir + "/tb"));
  logger_.write_document("config", yaml_to_json(YAML::Load(config_yaml_)));
  const char* attention = fused_attention_active() ? "fused CUDA kernels" : "plain LibTorch";
  const char* layer_norm = bf16_ && settings_.model.bf16_layer_norm ? "bf16" : "fp32";
  logger_.write_document("model", nlohmann::json{{"parameters", model_->parameter_count()},
                                                 {"physics_attention", attention},
                                                 {"layer_norm", layer_norm}});
  std::printf("Model: %lld parameters, physics attention: %s, layer norm: %s\n",
              static_cast<long long>(model_->parameter_count()), attention, layer_norm);
  logger_.write_document("dataset", nlohmann::json{{"train", data_.train->describe()},
                                                   {"val", data_.val->describe()},
                                                   {"num_train", data_.train->size()},
                                                   {"num_val", data_.val->size()},
                                                   {"world_size", world_}});
}

bool Trainer::fused_attention_active() const {
  const auto& m = settings_.model;
  if (!m.fused_attention || !bf16_) return false;
  const auto probe = torch::empty({1, 1, m.n_head, m.n_hidden / m.n_head},
                                  torch::dtype(torch::kBFloat16).device(device_));
  return slice_ops::kernels_apply(probe, m.slice_num);
}

LoaderOptions Trainer::loader_options() const { return loader_options_for(settings_, device_); }

void Trainer::check_same_config_on_every_rank() {
  if (comm_ == nullptr || world_ <= 1) return;
  // FNV-1a of the resolved config (as given, before run_id is filled in).
  uint64_t hash = 1469598103934665603ULL;
  for (char c : config_yaml_) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(device_);
  auto mine = torch::full({1}, static_cast<int64_t>(hash >> 1), opts);
  auto root = mine.clone();
  comm_->broadcast(root, 0);
  auto differs = torch::zeros({world_}, opts);
  differs[rank_] = (root != mine).to(torch::kLong).squeeze();
  comm_->all_reduce_max(differs);
  const auto flags = differs.cpu();
  std::string ranks;
  for (int r = 0; r < world_; ++r) {
    if (flags[r].item<int64_t>() != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  TORCH_CHECK(ranks.empty(), "distributed: rank(s) ", ranks,
              " started with a config that differs from rank 0's; every rank must get the same "
              "config and overrides");
}

double Trainer::global_max(double value) {
  if (comm_ == nullptr || world_ <= 1) return value;
  auto t = torch::full({1}, value, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  comm_->all_reduce_max(t);
  return t.item<double>();  // the epoch summary may block
}

EpochResult Trainer::train_epoch(int64_t epoch) {
  setup_logging();
  model_->train();
  const auto order = epoch_order(data_.train->size(), epoch, settings_.seed, settings_.shuffle,
                                 rank_, world_, /*drop_last=*/true);
  const int64_t steps = settings_.steps_per_epoch > 0 ? settings_.steps_per_epoch
                                                       : static_cast<int64_t>(order.size());
  std::vector<size_t> epoch_samples;
  for (int64_t i = 0; i < steps; ++i) epoch_samples.push_back(order[i % order.size()]);
  LoaderOptions train_loader = loader_options();
  train_loader.augment = true;
  PrefetchLoader loader(data_.train, std::move(epoch_samples), train_loader, epoch);
  reset_peak_memory(device_);
  const int64_t first_step = global_step_;
  Accumulator acc;
  StepReadback readback(
      [&](const StepRecord& r) {
        acc.add(r.values);
        if (rank_ != 0) return;
        logger_.write(step_log_record("train", r, epoch, r.step - first_step + 1, steps,
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
        AutocastGuard autocast(device_, bf16_);
        prediction = model_->forward(batch.embedding, batch.fx);
      }
      phase(Phase::kLoss);
      LossResult result = loss_->compute(prediction, batch.target, batch.weights);
      phase(Phase::kBackward);
      optimizer_->zero_grad();
      if (averager_) averager_->prepare();
      result.total.backward();
      if (averager_) averager_->finish();
      phase(Phase::kOptimizer);
      const double lr = optimizer_->lr();
      optimizer_->step();
      const double step_time = seconds_since(t0);
      step_times_.push_back(step_time);
      phase(Phase::kReadback);
      readback.start(global_step_, result.scalars,
                     {{"lr", lr}, {"step_time_s", step_time}, {"mem_gb", memory_in_use_gb(device_)}});
      ++global_step_;
      if (settings_.scheduler_per_step) optimizer_->set_lr(scheduled_lr(settings_, global_step_));
      phase(Phase::kLogging);
      readback.deliver_landed();
      if (audit_.active()) audit_.end_steady_step();
    }
    phase(Phase::kOther);
    readback.drain();
  }
  return finish_epoch("train", epoch, steps, seconds_since(epoch_t0), acc.means());
}

EpochResult Trainer::val_epoch(int64_t epoch) {
  setup_logging();
  model_->eval();
  torch::NoGradGuard no_grad;
  const auto order = epoch_order(data_.val->size(), epoch, settings_.seed, /*shuffle=*/false,
                                 rank_, world_, /*drop_last=*/false);
  const int64_t steps = static_cast<int64_t>(order.size());
  // The same points every epoch, so that val losses compare across epochs.
  PrefetchLoader loader(data_.val, order, loader_options(), /*epoch=*/0);
  Accumulator acc;
  const int64_t first = val_step_;
  StepReadback readback(
      [&](const StepRecord& r) {
        acc.add(r.values);
        if (rank_ != 0) return;
        logger_.write(step_log_record("val", r, epoch, r.step - first + 1, steps,
                                      {{"epoch", static_cast<double>(epoch), FieldKind::kIndex},
                                       {"val_step", static_cast<double>(r.step - first),
                                        FieldKind::kIndex}}));
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
        AutocastGuard autocast(device_, bf16_);
        prediction = model_->forward(batch.embedding, batch.fx);
      }
      LossResult result = loss_->compute(prediction, batch.target, batch.weights);
      readback.start(val_step_++, result.scalars, {{"step_time_s", seconds_since(t0)}});
      readback.deliver_landed();
    }
    readback.drain();
  }
  return finish_epoch("val", epoch, steps, seconds_since(epoch_t0), acc.means());
}

EpochResult Trainer::finish_epoch(const char* phase, int64_t epoch, int64_t steps, double seconds,
                                  std::map<std::string, double> means) {
  EpochResult r;
  r.epoch = epoch;
  r.steps = steps;
  r.seconds = seconds;
  r.peak_memory_gib = global_max(peak_memory_gib(device_));
  r.means = std::move(means);
  log_summary(phase, r);
  return r;
}

void Trainer::log_summary(const char* phase, const EpochResult& r) {
  if (rank_ != 0) return;
  LogRecord rec;
  rec.kind = std::string(phase) + "_summary";
  rec.phase = phase;
  rec.per_step = false;
  rec.tb_step = r.epoch;
  rec.epoch = r.epoch;
  rec.fields.push_back({"epoch", static_cast<double>(r.epoch), FieldKind::kIndex});
  for (const auto& key : loss_->keys()) {
    auto it = r.means.find(key);
    if (it != r.means.end()) rec.fields.push_back({key, it->second, kind_of(key)});
  }
  if (std::string(phase) == "train") {
    rec.fields.push_back({"lr", optimizer_->lr(), FieldKind::kLearningRate});
  }
  rec.fields.push_back({"epoch_seconds", r.seconds, FieldKind::kPerformance});
  rec.fields.push_back({"steps", static_cast<double>(r.steps), FieldKind::kPerformance});
  rec.fields.push_back({"peak_memory_gib", r.peak_memory_gib, FieldKind::kPerformance});
  logger_.write(rec);
}

std::string Trainer::sync_audit_report() const {
  if (!audit_available_) {
    return "Sync audit: not available (this build has no CUDA; nothing was counted)\n";
  }
  return audit_.report();
}

TrainResult Trainer::fit() {
  setup_logging();
  TrainResult result;
  result.run_dir = settings_.run_dir();
  const std::string ckpt_dir = settings_.run_dir() + "/checkpoints";
  int64_t start_epoch = 0;
  if (settings_.resume) {
    if (auto info = load_newest_checkpoint(ckpt_dir, &model_, optimizer_.get())) {
      start_epoch = info->epoch;
      global_step_ = info->global_step;
      if (rank_ == 0) {
        std::cout << "Resumed from " << info->path << " (epoch " << info->epoch << ", step "
                  << info->global_step << ")\n";
      }
    }
  }
  result.start_epoch = start_epoch;
  for (int64_t epoch = start_epoch + 1; epoch <= settings_.num_epochs; ++epoch) {
    if (!settings_.scheduler_per_step) optimizer_->set_lr(scheduled_lr(settings_, epoch - 1));
    result.train.push_back(train_epoch(epoch));
    if (settings_.validate && data_.val->size() > 0) result.val.push_back(val_epoch(epoch));
    if (rank_ == 0) logger_.end_epoch(epoch);
    if (rank_ == 0 && (epoch % settings_.save_interval == 0 || epoch == settings_.num_epochs)) {
      save_checkpoint(ckpt_dir, epoch, global_step_, model_, *optimizer_);
    }
  }
  logger_.flush();
  return result;
}

}  // namespace slipstream::aero
