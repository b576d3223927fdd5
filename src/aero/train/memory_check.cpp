#include "aero/train/memory_check.h"

#include "aero/model/memory_estimate.h"
#include "aero/train/epoch_result.h"
#include "core/device/device.h"
#include "core/process/host_memory.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <cstdio>
#include <string>

namespace slipstream::aero {

void check_step_memory(const Run& run, const Batch& batch) {
  const auto& s = run.settings();
  const double points = batch_points(batch, 1);
  if (!s.memory_check || !std::isfinite(points)) return;
  const Config& c = run.config;
  const bool fused = run.device.is_cuda() && run.bf16() && c.has("model.fused_attention") &&
                     c.get<bool>("model.fused_attention");
  const auto estimate =
      estimate_training_memory(c, run.model->parameter_count(), static_cast<int64_t>(points),
                               run.bf16(), fused, s.recompute);
  const double capacity = memory_capacity_bytes(run.device);
  if (!estimate || capacity <= 0) return;
  // On the CPU the model and its state are already in memory, outside what
  // is still available; a GPU's capacity is its whole memory.
  const double need = run.device.is_cuda() ? estimate->total()
                                           : estimate->activation_bytes + estimate->working_bytes;
  TORCH_CHECK(
      need <= capacity, "train: rank ", run.rank, ": a step of ", static_cast<int64_t>(points),
      " points (sample '", batch.sample_id, "') needs ", estimate->describe(), ", more than the ",
      format_gib(capacity),
      run.device.is_cuda() ? " of " + run.device.str() : std::string(" this machine has available"),
      ". Fewer points a step (dataset.sampling_resolution), training.recompute=block "
      "(one block's activations at a time), a smaller model (model.n_layers, "
      "model.n_hidden) or more ranks sharing each sample (distributed.domain_parallel) "
      "make it smaller; training.memory_check=false tries anyway");
  if (run.rank == 0) {
    std::printf(
        "Memory: a step of %lld points needs %s, of the %s %s\n", static_cast<long long>(points),
        estimate->describe().c_str(), format_gib(capacity).c_str(),
        run.device.is_cuda() ? ("of " + run.device.str()).c_str() : "this machine has available");
    std::fflush(stdout);
  }
}

}  // namespace slipstream::aero
