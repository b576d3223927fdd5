// A run's checkpoints, as fit() uses them: where it resumes, and saving
// with pruning.
//
// resume_position(): with training.start_over the run's checkpoints and logs
// are discarded; training.resume=false on a run that has checkpoints is an
// error (it would overwrite them); otherwise the newest good checkpoint is
// loaded into the model and optimizer (a damaged one is skipped, one of
// another config is an error that loads nothing), its recorded meaning is
// compared with the run's (meaning_differences: an error naming each
// difference, before anything is written) and the logs are trimmed to it.
// Every rank loads; only rank 0 (which holds `dir`) writes.
#pragma once

#include "aero/run/checkpoint.h"
#include "aero/run/run_directory.h"
#include "aero/train/run.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace slipstream::aero {

TrainPosition resume_position(Run& run, RunDirectory* dir);

// Each way a checkpoint's metadata and a run's (Run::checkpoint_metadata)
// differ in meaning: target fields, inputs, transforms, precision, model and
// its widths; a key one side lacks (an older checkpoint) is not compared.
std::vector<std::string> meaning_differences(const std::map<std::string, std::string>& checkpoint,
                                             const std::map<std::string, std::string>& run);

// Rank 0 saves (no other rank writes), then prunes to training.keep_last.
// `val_loss` (the epoch's, when it validated) is recorded in the file; with
// training.keep_best, one lower than the best so far (or the first) makes
// the file checkpoints/best.safetensors too (a hard link: no copy). Returns
// the file written (empty on other ranks).
std::string save_run_checkpoint(Run& run, const TrainPosition& position,
                                std::optional<double> val_loss = std::nullopt);

// A run's best checkpoint (training.keep_best), read from its header.
struct BestCheckpoint {
  std::string path;
  int64_t epoch = 0;
  double val_loss = 0;
};
std::optional<BestCheckpoint> best_checkpoint(const std::string& checkpoints_dir);

// training.resume=auto with run_id null: the run_id of the newest run under
// `output_dir` that was written with this config (run_id aside), whose
// newest good checkpoint has fewer than `num_epochs` epochs done, and that
// no live process holds; empty when there is none. Newest: its newest
// checkpoint's modification time.
std::string find_unfinished_run(const std::string& output_dir, const Config& config,
                                int64_t num_epochs);

// Whether any rank asked to stop (a signal). Blocking: once an epoch.
bool any_rank_requests_stop(Run& run);

}  // namespace slipstream::aero
