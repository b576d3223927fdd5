// LogRecord: one line of the training log, built once and handed to every
// sink (console, JSONL, TensorBoard). A record knows nothing of CFD: it is a
// kind ("train_step", "val_summary", ...), a phase that picks the TensorBoard
// writer, and ordered named scalars, each tagged with what it is so that
// every sink can lay it out its own way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slipstream {

enum class FieldKind {
  kIndex,         // epoch, global_step: JSONL only, TensorBoard uses the step
  kLoss,          // "loss" (the total) or "loss/<field>"
  kMetric,        // "<field>_l2", "velocity_x_mae", ...
  kLearningRate,  // "lr"
  kPerformance,   // "step_time_s", "mem_gb", "epoch_seconds", ...
};

struct Field {
  std::string key;
  double value = 0.0;
  FieldKind kind = FieldKind::kMetric;
};

struct LogRecord {
  std::string kind;      // JSONL "kind": train_step, val_step, train_summary, ...
  std::string phase;     // "train" or "val"
  bool per_step = true;  // TensorBoard prefix: iteration/ (true) or epoch/
  int64_t tb_step = 0;   // TensorBoard's x axis
  int64_t epoch = 0;     // console: "Epoch <epoch>/<epochs> [<index>/<count>]"
  int64_t epochs = 0;    // the run's epochs (0: not known)
  int64_t index_in_epoch = 0;
  int64_t steps_in_epoch = 0;
  std::vector<Field> fields;

  // The value of `key`, or NaN when absent.
  double get(const std::string& key) const;
};

// TensorBoard tag of a field: iteration/loss/<field> (the total is
// iteration/loss/total), iteration/metrics/<name>, iteration/lr,
// iteration/performance/<name>; epoch/... for summaries. Empty for indices.
std::string tensorboard_tag(const LogRecord& record, const Field& field);

}  // namespace slipstream
