// Checkpoints: one safetensors file per saved epoch,
//   <dir>/checkpoint_epoch_<NNNN>.safetensors
// holding "model.<name>" (every parameter), "optim.<name>" (the optimizer
// state) and metadata: epoch, global_step, format, and what the run adds
// (the precision it trained in, its target fields with their normalisation
// statistics, the model family and its input widths). Written to a temp
// file and renamed, so a crash never leaves a partial checkpoint under the
// final name; resume picks the newest file that reads back completely.
#pragma once

#include "aero/model/model.h"
#include "aero/optim/muon_adamw.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace slipstream::aero {

struct CheckpointInfo {
  std::string path;
  int64_t epoch = 0;        // epochs completed
  int64_t global_step = 0;  // train steps completed
  std::map<std::string, std::string> metadata;
};

std::string save_checkpoint(const std::string& dir, int64_t epoch, int64_t global_step,
                            Model& model, const MuonAdamW& optimizer,
                            const std::map<std::string, std::string>& metadata = {});

// Checkpoint files in `dir`, newest epoch first (ignores temp files).
std::vector<std::string> list_checkpoints(const std::string& dir);

// Loads `path` into model and optimizer (either may be null); throws naming
// the file on any problem.
CheckpointInfo load_checkpoint(const std::string& path, Model* model, MuonAdamW* optimizer);

// `path` is a checkpoint file, or a directory whose newest complete
// checkpoint is taken (older ones are tried if the newest is damaged).
std::optional<CheckpointInfo> load_newest_checkpoint(const std::string& path, Model* model,
                                                     MuonAdamW* optimizer);

// The metadata of `path` (a file, or a directory's newest readable
// checkpoint) without loading any tensor into a model.
std::optional<CheckpointInfo> read_checkpoint_info(const std::string& path);

}  // namespace slipstream::aero
