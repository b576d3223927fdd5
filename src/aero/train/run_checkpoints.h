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

#include "aero/train/checkpoint.h"
#include "aero/train/run.h"
#include "aero/train/run_directory.h"

#include <map>
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
void save_run_checkpoint(Run& run, const TrainPosition& position);

// Whether any rank asked to stop (a signal). Blocking: once an epoch.
bool any_rank_requests_stop(Run& run);

}  // namespace slipstream::aero
