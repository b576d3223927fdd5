// Checkpoints: one safetensors file per save,
//   <dir>/checkpoint_epoch_<E>.safetensors            E epochs done
//   <dir>/checkpoint_epoch_<E>_step_<S>.safetensors   E epochs and S steps of the next (a stop)
// holding "model.<name>" (every parameter), "optim.<name>" (the optimizer
// state) and metadata: the format, where the run stands (TrainPosition), a
// CRC-32C of every tensor, what the run adds (the precision, the target
// fields with their statistics, the model family and its input widths), and
// a CRC-32C of all of that metadata (the header checksum).
//
// A save refuses, before writing anything, a state holding a non-finite
// value; it writes to a temp file and renames, so a crash never leaves a
// partial checkpoint under the final name. A load checks everything before
// it copies anything: the format, the header's checksum, every tensor's
// checksum and that every tensor written is there (any failure is
// CheckpointDamaged: the file is not what was written), then every name,
// shape and dtype against the model and optimizer (CheckpointMismatch,
// listing every difference: the checkpoint is of another config).
#pragma once

#include "aero/model/model.h"
#include "aero/optim/muon_adamw.h"

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace slipstream::aero {

// Where a run stands.
struct TrainPosition {
  int64_t epochs_done = 0;       // complete epochs
  int64_t steps_into_epoch = 0;  // steps of the next epoch already taken (a mid-epoch stop)
  int64_t global_step = 0;       // train steps taken
  int64_t val_step = 0;          // validation steps taken (TensorBoard's val axis)
  nlohmann::json epoch_means;    // the partial epoch's running sums (StepMeans::state)
};

struct CheckpointInfo {
  std::string path;
  TrainPosition position;
  std::map<std::string, std::string> metadata;
};

class CheckpointDamaged : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class CheckpointMismatch : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string save_checkpoint(const std::string& dir, const TrainPosition& position, Model& model,
                            const MuonAdamW& optimizer,
                            const std::map<std::string, std::string>& metadata = {});

// Checkpoint files in `dir`, newest first (temp files are not listed).
std::vector<std::string> list_checkpoints(const std::string& dir);

// A checkpoint file read once and checked as above (CheckpointDamaged
// otherwise): its position, metadata and tensors, in host memory.
struct CheckpointFile {
  CheckpointInfo info;
  std::map<std::string, at::Tensor> tensors;
};
CheckpointFile read_checkpoint(const std::string& path);
// Loads a read checkpoint into model and optimizer (either may be null:
// then its tensors are neither checked nor loaded); CheckpointMismatch,
// naming each difference, when they are of another config.
void apply_checkpoint(const CheckpointFile& file, Model* model, MuonAdamW* optimizer);

// read_checkpoint, then apply_checkpoint.
CheckpointInfo load_checkpoint(const std::string& path, Model* model, MuonAdamW* optimizer);

// `path` is a checkpoint file, or a directory whose newest good checkpoint
// is taken: a damaged one is reported and the one before it tried; a
// mismatch is an error. Null when the directory holds no checkpoint; an
// error when it holds some and every one is damaged.
std::optional<CheckpointFile> read_newest_checkpoint(const std::string& path);
// read_newest_checkpoint, then apply_checkpoint.
std::optional<CheckpointInfo> load_newest_checkpoint(const std::string& path, Model* model,
                                                     MuonAdamW* optimizer);

// training.keep_best's copy (a hard link) of the best checkpoint, inside
// the checkpoints directory; list_checkpoints does not list it, so a resume
// never takes it for the newest.
inline constexpr const char* kBestCheckpointName = "best.safetensors";

// Removes all but the newest `keep` checkpoints of `dir`.
void prune_checkpoints(const std::string& dir, int64_t keep);

}  // namespace slipstream::aero
