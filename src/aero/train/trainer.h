// Trainer: the recipe's training loop around the sync-free readback, over a
// Run that build_run() assembled (train/run.h).
//
// Per train step: next batch (prefetched), forward under bf16 autocast when
// the run's precision is bf16, loss and metrics as on-device 0-d tensors,
// backward, gradient all-reduce when distributed, optimizer step; then
// StepReadback::start() with the step's lr and wall time, and
// deliver_landed(). Nothing in the loop reads a device value on the host.
// With training.cuda_graph (auto: on CUDA, one process) forward, loss and
// backward are captured once as a CUDA graph at an epoch's second step and
// replayed after it (graphed_step.h); the epoch then runs on a side stream.
// The epoch's end drains the readback, logs the summary (mean of the
// epoch's step values, which are already all-rank means), saves a checkpoint
// every `save_interval` epochs and steps the schedule.
//
// Faults (StepGuard): a non-finite loss or gradient stops every rank after
// the same step with NonFiniteError (exit 3) and no checkpoint of it; a
// SIGTERM or SIGINT finishes the step, drains, checkpoints (mid-epoch if it
// must) and fit() returns the signal. fit() resumes from the newest good
// checkpoint (a mid-epoch one continues its epoch at the next step, with the
// same samples) and continues the logs without repeating a step.
//
// Only rank 0 writes logs and checkpoints; every rank runs the same number
// of steps, so per-step collectives cannot deadlock.
#pragma once

#include "aero/run/run_directory.h"
#include "aero/train/epoch_result.h"
#include "aero/train/run.h"
#include "core/device/sync_audit.h"
#include "core/readback/step_means.h"
#include "core/readback/step_readback.h"
#include "core/sinks/metrics_logger.h"

#include <c10/core/Stream.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace slipstream::aero {

struct TrainResult {
  std::vector<EpochResult> train, val;
  std::string run_dir;
  int64_t start_epoch = 0;  // > 0 when resumed
  int stop_signal = 0;      // SIGTERM or SIGINT when a signal stopped the run, else 0
  double seconds = 0;       // this session's wall time
  int64_t epochs_done = 0;  // complete epochs at the end (earlier sessions' included)
  int64_t global_step = 0;
  std::string last_checkpoint;  // the newest file written, empty when none was
  // training.keep_best's checkpoint and the epoch and val loss it holds
  // (earlier sessions' included); empty path when there is none.
  std::string best_checkpoint;
  int64_t best_epoch = 0;
  double best_val_loss = 0;
  // The end-of-run record (run_summary.h), as written to summary.json.
  nlohmann::json summary;
};

class Trainer {
 public:
  explicit Trainer(Run& run);
  ~Trainer();

  TrainResult fit();

  // For `slipstream bench` and tests: one epoch each, with no checkpoints.
  // `first_step` > 0 continues an epoch a stop cut short.
  EpochResult train_epoch(int64_t epoch, int64_t first_step = 0);
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

  // How the run was started (the command line, overrides, version and
  // commit): logged with the config and kept in summary.json.
  void set_invocation(nlohmann::json invocation) { invocation_ = std::move(invocation); }

  Run& run() { return run_; }
  // Train steps taken (a resumed run's earlier ones included).
  int64_t global_step() const { return global_step_; }

 private:
  // How many steps a delivery may lag (StepReadback::max_in_flight), and so
  // how many steps after a flagged one every rank stops.
  static constexpr int64_t kMaxStepsInFlight = 4;

  void setup_logging(const nlohmann::json& resume = false);
  // Fills result's best_* from the run's best checkpoint (rank 0).
  void note_best(TrainResult& result) const;
  // The train loader of an epoch from `first_step` on, and its steps.
  std::unique_ptr<PrefetchLoader> train_loader(int64_t epoch, int64_t first_step,
                                               int64_t& steps) const;

  Run& run_;
  nlohmann::json invocation_ = nlohmann::json::object();
  MetricsLogger logger_;
  int64_t global_step_ = 0;
  int64_t val_step_ = 0;
  std::vector<double> step_times_;
  std::function<void(int64_t)> step_hook_;
  std::unique_ptr<RunDirectory> dir_;  // rank 0, under fit()
  StepMeans partial_means_;            // a resumed epoch's steps before the stop
  bool audit_enabled_ = false;
  bool audit_available_ = true;
  SyncAudit audit_;
  // The stream graphed epochs run on, the same for all of them
  // (training.cuda_graph; graphed_step.h).
  std::optional<c10::Stream> graph_stream_;
  // Set when an epoch's batches changed shape more often than a graph pays
  // for (GraphedStep::gave_up): later epochs do not try again.
  bool graphs_given_up_ = false;
  bool memory_checked_ = false;
  // The next epoch's train loader, started when this epoch's last batch was
  // handed out, so that its first samples load during the last steps,
  // validation and the checkpoint instead of at the epoch's first step.
  std::unique_ptr<PrefetchLoader> next_loader_;
  int64_t next_loader_epoch_ = -1;
};

}  // namespace slipstream::aero
