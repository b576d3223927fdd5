// What training a model takes in memory, from its config, before its first
// step: so that a config far beyond the device is refused with the numbers
// and the keys to change, not killed by the kernel after minutes of growth
// (or an out-of-memory error deep in a backward).
//
// Per point and block, the forward keeps for the backward (elements of the
// autocast width: 2 bytes in bf16, 4 in fp32):
//   the pointwise tensors   (7 + 2·mlp_ratio)·n_hidden: the block's input,
//                           its LayerNorms' outputs, the slice projections,
//                           the deslice and output projections, the MLP's
//                           hidden layer before and after GELU
//   physics attention       3·n_head·slice_num (logits, weights, scaled),
//                           none where the fused kernels run (CUDA, bf16)
// training.recompute=attention keeps (3 + 2·mlp_ratio)·n_hidden of these,
// =block one n_hidden-wide input a block plus one block's tensors at a
// time. GeoTransolver's context and local features add half again (as its
// volume step's peak does against Transolver's at the same width and
// points). The backward's transient is taken as two of the widest tensors
// (mlp_ratio·n_hidden, fp32) at once; the state is fp32 weights, gradients
// and two optimizer moments, plus bf16 copies under bf16.
#pragma once

#include "aero/config/config.h"
#include "aero/ops/recompute.h"

#include <cstdint>
#include <optional>
#include <string>

namespace slipstream::aero {

struct MemoryEstimate {
  int64_t points = 0;
  double state_bytes = 0;       // weights, gradients, optimizer moments
  double activation_bytes = 0;  // what the forward keeps for the backward
  double working_bytes = 0;     // the backward's transient peak
  double total() const { return state_bytes + activation_bytes + working_bytes; }
  // "about 96.1 GiB (state 0.1 GiB, activations 95.0 GiB at 200000 points, working 1.0 GiB)"
  std::string describe() const;
};

// Null for a model family the estimate does not know.
std::optional<MemoryEstimate> estimate_training_memory(const Config& config, int64_t num_parameters,
                                                       int64_t points, bool bf16,
                                                       bool fused_kernels,
                                                       const RecomputeOptions& recompute);

}  // namespace slipstream::aero
