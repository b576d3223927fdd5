// LossCalculator and metrics, as the recipe computes them, in fp32, without
// reading anything back to the host: every result is an on-device 0-d tensor.
//
// Loss per field (type huber with delta 1, mse, or rmse = mse / mean(t^2)):
// the sum of its per-component losses times the field's loss weight (logged
// as loss/<field>, as the recipe logs it); the total is the sum of those
// over the total channel count. Metrics per scalar field, per vector component
// (velocity_x_l2) and per vector field (velocity_l2):
//   l1 = sum|p-t| / sum|t|,  l2 = ||p-t|| / ||t||,  mae = mean|p-t|.
// Optional per-point weights (cell area or volume) weight every sum. With
// mask_nonfinite, targets that are NaN or Inf are left out of every sum, and
// each metric carries its count of finite targets into the readback.
// With loss.forces on (force_loss.h), the batch's force weights turn the
// prediction's error into each sample's coefficient errors dC_k: the total
// adds weight * mean_b sum_k (dC_k / scale)^2, logged as loss/forces, and
// <coefficient>_error is mean_b |dC_k| (e.g. CD_error).
#pragma once

#include "aero/fields/field_schema.h"
#include "aero/forces/force_loss.h"
#include "core/distributed/communicator.h"
#include "core/readback/step_scalars.h"

#include <torch/types.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace slipstream::aero {

struct LossOptions {
  std::string type = "huber";  // huber | mse | rmse
  bool mask_nonfinite = false;
  FieldSchema fields = default_volume_fields();  // channels and loss weights
  std::vector<std::string> metrics = {"l1", "l2", "mae"};
  ForceLossOptions forces;  // off unless forces.weight > 0
  // Domain parallelism: each rank holds a shard of the sample's points; the
  // per-channel sums (and finite counts) are summed over this group
  // (domain_sum, so their gradients are too) before any ratio, and every
  // rank gets the whole sample's loss and metrics. Null: the points here
  // are the whole sample.
  Communicator* domain_group = nullptr;
};

struct LossResult {
  torch::Tensor total;  // 0-d fp32, differentiable
  StepScalars scalars;  // "loss", "loss/<field>", then the metrics
};

class LossCalculator {
 public:
  explicit LossCalculator(LossOptions options);
  // prediction, target: (B, N, C) or (N, C); weights: (B, N), (N) or
  // undefined; force_weights: (B, N, C, K) or (N, C, K), needed when
  // forces are on (and ignored when off).
  LossResult compute(const torch::Tensor& prediction, const torch::Tensor& target,
                     const torch::Tensor& weights = {},
                     const torch::Tensor& force_weights = {}) const;
  const LossOptions& options() const { return options_; }
  // The keys compute() reports, in order.
  std::vector<std::string> keys() const;

 private:
  // Per device: which channel sums make each metric (built once, cached).
  struct MetricSelection {
    std::vector<std::string> keys;
    torch::Tensor numerator, denominator;  // (5*C, K)
    torch::Tensor channels;                // (C, K)
    torch::Tensor power;                   // (K): 0.5 for l2, else 1
  };
  const MetricSelection& selection(c10::Device device) const;

  LossOptions options_;
  int64_t channels_;
  mutable std::mutex selection_mutex_;
  mutable std::map<std::string, MetricSelection> selections_;
};

}  // namespace slipstream::aero
