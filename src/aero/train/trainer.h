// Trainer: the recipe's training loop around the sync-free readback, over a
// Run that build_run() assembled (train/run.h).
//
// Per train step: next batch (prefetched), forward under bf16 autocast when
// the run's precision is bf16, loss and metrics as on-device 0-d tensors,
// backward, gradient all-reduce when distributed, optimizer step; then
// StepReadback::start() with the step's lr and wall time, and
// deliver_landed(). Nothing in the loop reads a device value on the host.
// The epoch's end drains the readback, logs the summary (mean of the
// epoch's step values, which are already all-rank means), saves a checkpoint
// every `save_interval` epochs and steps the schedule.
//
// Only rank 0 writes logs and checkpoints; every rank runs the same number
// of steps, so per-step collectives cannot deadlock.
#pragma once

#include "aero/train/run.h"
#include "core/device/sync_audit.h"
#include "core/readback/step_readback.h"
#include "core/sinks/metrics_logger.h"

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace slipstream::aero {

struct EpochResult {
  int64_t epoch = 0;
  int64_t steps = 0;
  double seconds = 0.0;
  double peak_memory_gib = 0.0;
  std::map<std::string, double> means;  // per key, NaN steps left out
};

struct TrainResult {
  std::vector<EpochResult> train, val;
  std::string run_dir;
  int64_t start_epoch = 0;  // > 0 when resumed
};

class Trainer {
 public:
  explicit Trainer(Run& run);
  ~Trainer();

  TrainResult fit();

  // For `slipstream bench` and tests: one epoch each, with no checkpoints.
  EpochResult train_epoch(int64_t epoch);
  EpochResult val_epoch(int64_t epoch);
  void set_readback_policy(ReadbackPolicy p) { run_.spec.settings.readback = p; }
  // Per-step wall times (seconds) of the last train epoch, host clock.
  const std::vector<double>& last_step_times() const { return step_times_; }
  // Called at the start of each train step with its index in the epoch.
  void set_step_hook(std::function<void(int64_t)> hook) { step_hook_ = std::move(hook); }

  // Counts synchronizing CUDA calls per steady-state train step, by phase.
  // Must be called on the training thread (c10's warning handler is per-thread).
  void set_sync_audit(bool on);
  std::string sync_audit_report() const;
  const SyncAudit& sync_audit() const { return audit_; }

  Run& run() { return run_; }

 private:
  void setup_logging();
  StepReadback::Options readback_options(const char* phase) const;
  EpochResult finish_epoch(const char* phase, int64_t epoch, int64_t steps, double seconds,
                           const std::map<std::string, double>& means);

  Run& run_;
  MetricsLogger logger_;
  int64_t global_step_ = 0;
  int64_t val_step_ = 0;
  std::vector<double> step_times_;
  std::function<void(int64_t)> step_hook_;
  bool audit_enabled_ = false;
  bool audit_available_ = true;
  SyncAudit audit_;
};

}  // namespace slipstream::aero
