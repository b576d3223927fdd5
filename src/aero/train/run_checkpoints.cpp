#include "aero/train/run_checkpoints.h"

#include "core/process/stop_signal.h"

#include <torch/torch.h>

#include <iostream>

namespace slipstream::aero {

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
