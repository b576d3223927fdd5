// The log records the trainer writes (core/sinks/log_record.h): one per
// delivered train or val step, one per epoch summary, in the recipe's fields.
#pragma once

#include "aero/train/run.h"
#include "core/readback/step_readback.h"
#include "core/sinks/log_record.h"
#include "core/sinks/metrics_logger.h"

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace slipstream::aero {

// "loss" and "loss/<field>" are losses; the rest of a step's values metrics.
FieldKind kind_of(const std::string& key);

// One delivered step: its index fields, the device values, then the host
// fields (lr, step_time_s, data_time_s: the host's wait for the batch, mem_gb).
LogRecord step_log_record(const std::string& phase, const StepRecord& r, int64_t epoch,
                          int64_t index_in_epoch, int64_t steps, std::vector<Field> index_fields);

// An epoch summary: the means of `keys` (in that order), lr (train), then
// epoch_seconds, steps, peak_memory_gib, data_time_s (the epoch's host wait
// for its batches) and data_wait_share (data_time_s / epoch_seconds: near 1,
// the data starves the device).
struct EpochTimes {
  double seconds = 0, data_seconds = 0;
  int64_t steps = 0;
  double peak_memory_gib = 0;
};
LogRecord summary_log_record(const std::string& phase, int64_t epoch,
                             const std::map<std::string, double>& means,
                             const std::vector<std::string>& keys, std::optional<double> lr,
                             const EpochTimes& times);

// Rank 0's sinks of a run (console, metrics.jsonl, TensorBoard where
// configured) added to `logger`, resolved_config.yaml written, and the
// `config` and `dataset` records (with `resume` and `invocation`) logged;
// the console's "Model:" line. Nothing where logger already has sinks.
void open_run_logs(MetricsLogger& logger, const Run& run, const nlohmann::json& resume,
                   const nlohmann::json& invocation);

}  // namespace slipstream::aero
