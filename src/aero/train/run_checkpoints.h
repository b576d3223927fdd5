// A run's checkpoints, as fit() uses them: where it resumes, and saving
// with pruning.
//
// resume_position(): with training.start_over the run's checkpoints and logs
// are discarded; training.resume=false on a run that has checkpoints is an
// error (it would overwrite them); otherwise the newest good checkpoint is
// loaded into the model and optimizer (a damaged one is skipped, one of
// another config is an error that loads nothing) and the logs are trimmed
// to it. Every rank loads; only rank 0 (which holds `dir`) writes.
#pragma once

#include "aero/train/checkpoint.h"
#include "aero/train/run.h"
#include "aero/train/run_directory.h"

namespace slipstream::aero {

TrainPosition resume_position(Run& run, RunDirectory* dir);

// Rank 0 saves (no other rank writes), then prunes to training.keep_last.
void save_run_checkpoint(Run& run, const TrainPosition& position);

// Whether any rank asked to stop (a signal). Blocking: once an epoch.
bool any_rank_requests_stop(Run& run);

}  // namespace slipstream::aero
