#include "aero/train/run_checkpoints.h"

#include "core/process/stop_signal.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace slipstream::aero {

std::vector<std::string> meaning_differences(const std::map<std::string, std::string>& checkpoint,
                                             const std::map<std::string, std::string>& run) {
  // What the weights mean: which fields they predict, in which order and
  // units (statistics, nondimensionalisation), from which inputs, after which
  // transforms, at which precision, in which model. The schedule, the
  // logging and the device may change on a resume; these may not.
  static const std::vector<std::pair<const char*, const char*>> keys = {
      {"fields", "the target fields (their order, statistics or nondimensionalisation)"},
      {"inputs", "the model's inputs (their order or their sources)"},
      {"transforms", "the sample transforms (dataset.transforms.center, scale_by_L_ref)"},
      {"precision", "the precision"},
      {"model", "the model"},
      {"model_shape", "the model's input and output widths"}};
  std::vector<std::string> out;
  for (const auto& [key, what] : keys) {
    const auto c = checkpoint.find(key);
    const auto r = run.find(key);
    if (c == checkpoint.end() || r == run.end()) continue;  // not recorded by older versions
    bool same = c->second == r->second;
    if (!same) {
      // The same JSON written another way is the same meaning.
      try {
        same = nlohmann::json::parse(c->second) == nlohmann::json::parse(r->second);
      } catch (const std::exception&) {
      }
    }
    if (!same) {
      out.push_back(std::string(what) + ": the checkpoint has " + c->second + ", this config has " +
                    r->second);
    }
  }
  return out;
}

TrainPosition resume_position(Run& run, RunDirectory* dir) {
  const auto& s = run.settings();
  const std::string ckpt = s.run_dir() + "/checkpoints";
  const auto existing = list_checkpoints(ckpt);
  if (s.start_over || (!s.resume && !existing.empty())) {
    TORCH_CHECK(s.start_over, "run: '", s.run_dir(),
                "' has checkpoints (newest: ", existing.empty() ? "" : existing.front(),
                ") and training.resume=false would overwrite them; set training.start_over=true "
                "to discard them and the logs, or give this run another run_id");
    if (dir != nullptr) dir->clear();
    return {};
  }
  if (!s.resume) return {};
  auto info = load_newest_checkpoint(ckpt, run.model.get(), run.optimizer.get());
  if (!info) {
    // A fresh start, perhaps after a crash before the first checkpoint: the
    // steps it logged are trained again.
    if (dir != nullptr) dir->trim_logs(TrainPosition{});
    return {};
  }
  const auto differences = meaning_differences(info->metadata, run.checkpoint_metadata());
  if (!differences.empty()) {
    std::string list;
    for (const auto& d : differences) list += "\n  " + d;
    throw CheckpointMismatch("checkpoint: '" + info->path +
                             "' was trained on data of another meaning; " +
                             std::to_string(differences.size()) + " difference(s):" + list +
                             "\nNothing was overwritten. Resume with the config it was written "
                             "with (the checkpoint holds it: its 'config' metadata), or train "
                             "under another run_id.");
  }
  const TrainPosition& p = info->position;
  if (run.rank == 0) {
    std::cout << "Resumed from " << info->path << " (" << p.epochs_done << " epochs and "
              << p.steps_into_epoch << " steps of the next done, step " << p.global_step << ")\n";
  }
  if (dir != nullptr) dir->trim_logs(p);
  return p;
}

void save_run_checkpoint(Run& run, const TrainPosition& position) {
  if (run.rank != 0) return;
  const std::string dir = run.settings().run_dir() + "/checkpoints";
  save_checkpoint(dir, position, *run.model, *run.optimizer, run.checkpoint_metadata());
  prune_checkpoints(dir, run.settings().keep_last);  // only once the new one is in place
}

bool any_rank_requests_stop(Run& run) {
  double stop = StopSignals::requested() != 0 ? 1.0 : 0.0;
  if (run.comm && run.world_size > 1) {
    auto t =
        torch::full({1}, stop, torch::TensorOptions().dtype(torch::kDouble).device(run.device));
    run.comm->all_reduce_max(t);
    stop = t.item<double>();
  }
  return stop > 0;
}

}  // namespace slipstream::aero
