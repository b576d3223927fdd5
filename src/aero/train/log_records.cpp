#include "aero/train/log_records.h"

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

}  // namespace slipstream::aero
