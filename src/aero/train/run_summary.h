// The end of a training session, said once for the user and kept: the
// record fit() writes to <run>/summary.json and logs as "run_summary" in
// metrics.jsonl, and the lines `slipstream train` prints from it.
//
// summary.json: run_id, run_dir, status ("finished" | "stopped"), signal
// (when stopped), epochs_done, num_epochs, global_step, session_seconds,
// session_epochs [first, last] (this session's), best {epoch, val_loss,
// checkpoint} (null without validation or training.keep_best),
// last_checkpoint, last_epoch {train, val} (the last epoch's means, in
// normalised units), invocation (command line, overrides, version, commit:
// Trainer::set_invocation) and next {continue?, eval, infer, export,
// tensorboard?}: commands to run next, as text.
#pragma once

#include "aero/train/run.h"
#include "aero/train/trainer.h"

#include <nlohmann/json.hpp>

#include <string>

namespace slipstream::aero {

nlohmann::json run_summary(const Run& run, const TrainResult& result,
                           const nlohmann::json& invocation);

// The summary as console lines, ending with "Run directory: <dir>".
std::string format_run_summary(const nlohmann::json& summary);

// `words` joined by spaces, each quoted for a POSIX shell where it needs to be.
std::string shell_command(const std::vector<std::string>& words);

}  // namespace slipstream::aero
