#include "aero/train/epoch_result.h"

#include "aero/train/log_records.h"
#include "core/device/device.h"

#include <torch/torch.h>

#include <cmath>
#include <optional>

namespace slipstream::aero {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

StepReadback::Options readback_options(const Run& run, const char* phase) {
  StepReadback::Options ro;
  ro.policy = run.settings().readback;
  ro.comm = run.comm.get();
  ro.name = phase;
  return ro;
}

EpochResult finish_epoch(Run& run, MetricsLogger& logger, const char* phase, int64_t epoch,
                         int64_t steps, double seconds, double data_seconds,
                         const std::map<std::string, double>& means) {
  EpochResult r;
  r.epoch = epoch;
  r.steps = steps;
  r.seconds = seconds;
  r.data_seconds = data_seconds;
  r.peak_memory_gib = peak_memory_gib(run.device);
  r.means = means;
  if (run.comm && run.world_size > 1) {
    // The epoch summary may block: the largest peak over ranks.
    auto t = torch::full({1}, r.peak_memory_gib,
                         torch::TensorOptions().dtype(torch::kDouble).device(run.device));
    run.comm->all_reduce_max(t);
    r.peak_memory_gib = t.item<double>();
  }
  if (run.rank != 0) return r;
  const bool train = std::string(phase) == "train";
  logger.write(summary_log_record(phase, epoch, r.means, run.loss->keys(),
                                  train ? std::optional<double>(run.optimizer->lr()) : std::nullopt,
                                  {r.seconds, r.data_seconds, r.steps, r.peak_memory_gib}));
  return r;
}

double batch_points(const Batch& batch, int world_size) {
  const auto& t = batch.target;
  if (!t.defined() || t.dim() < 2) return std::nan("");
  return static_cast<double>(t.size(t.dim() - 2)) * world_size;
}

}  // namespace slipstream::aero
