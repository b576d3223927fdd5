#include "aero/train/log_records.h"

#include "core/io/atomic_file.h"
#include "core/sinks/console_sink.h"
#include "core/sinks/jsonl_sink.h"
#include "core/sinks/tensorboard_sink.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

namespace slipstream::aero {

FieldKind kind_of(const std::string& key) {
  if (key == "loss" || key.rfind("loss/", 0) == 0) return FieldKind::kLoss;
  return FieldKind::kMetric;
}

LogRecord step_log_record(const std::string& phase, const StepRecord& r, int64_t epoch,
                          int64_t index_in_epoch, int64_t steps, std::vector<Field> index_fields) {
  LogRecord rec;
  rec.kind = phase + "_step";
  rec.phase = phase;
  rec.tb_step = r.step;
  rec.epoch = epoch;
  rec.index_in_epoch = index_in_epoch;
  rec.steps_in_epoch = steps;
  rec.fields = std::move(index_fields);
  for (const auto& [k, v] : r.values) rec.fields.push_back({k, v, kind_of(k)});
  for (const auto& [k, v] : r.host) {
    rec.fields.push_back({k, v, k == "lr" ? FieldKind::kLearningRate : FieldKind::kPerformance});
  }
  return rec;
}

LogRecord summary_log_record(const std::string& phase, int64_t epoch,
                             const std::map<std::string, double>& means,
                             const std::vector<std::string>& keys, std::optional<double> lr,
                             const EpochTimes& t) {
  LogRecord rec;
  rec.kind = phase + "_summary";
  rec.phase = phase;
  rec.per_step = false;
  rec.tb_step = epoch;
  rec.epoch = epoch;
  rec.fields.push_back({"epoch", static_cast<double>(epoch), FieldKind::kIndex});
  for (const auto& key : keys) {
    auto it = means.find(key);
    if (it != means.end()) rec.fields.push_back({key, it->second, kind_of(key)});
  }
  // Steps left out of the means for a non-finite loss (val: train stops at one).
  if (auto nf = means.find("nonfinite_steps"); nf != means.end()) {
    rec.fields.push_back({"nonfinite_steps", nf->second, FieldKind::kMetric});
  }
  if (lr) rec.fields.push_back({"lr", *lr, FieldKind::kLearningRate});
  rec.fields.push_back({"epoch_seconds", t.seconds, FieldKind::kPerformance});
  rec.fields.push_back({"steps", static_cast<double>(t.steps), FieldKind::kPerformance});
  rec.fields.push_back({"peak_memory_gib", t.peak_memory_gib, FieldKind::kPerformance});
  rec.fields.push_back({"data_time_s", t.data_seconds, FieldKind::kPerformance});
  rec.fields.push_back({"data_wait_share", t.seconds > 0 ? t.data_seconds / t.seconds : 0.0,
                        FieldKind::kPerformance});
  return rec;
}

void open_run_logs(MetricsLogger& logger, const Run& run, const nlohmann::json& resume,
                   const nlohmann::json& invocation) {
  if (logger.sink_count() > 0) return;
  const auto& s = run.settings();
  const std::string dir = s.run_dir();
  std::filesystem::create_directories(dir);
  write_file_atomically(dir + "/resolved_config.yaml", run.config.to_yaml());
  logger.add_sink(std::make_unique<ConsoleSink>(stdout, s.console_every_n_steps));
  logger.add_sink(std::make_unique<JsonlSink>(dir + "/metrics.jsonl"));
  if (s.tensorboard) logger.add_sink(std::make_unique<TensorBoardSink>(dir + "/tb"));
  nlohmann::json config = run.config_record();
  config["resume"] = resume;
  config["invocation"] = invocation;
  logger.write_document("config", config);
  std::printf("Model: %s, %lld parameters, %s on %s, %s\n",
              config["model"].get<std::string>().c_str(),
              static_cast<long long>(config["num_parameters"].get<int64_t>()),
              to_string(run.precision).c_str(), run.device.str().c_str(),
              config["numerics"].dump().c_str());
  nlohmann::json dataset = run.dataset_record();
  dataset["resume"] = resume;
  logger.write_document("dataset", dataset);
}

}  // namespace slipstream::aero
