// Several zero-filled fp32 accumulators from one allocation and one fill:
// for kernels that atomically add into a few small outputs (a LayerNorm's
// weight and bias gradients, the slice sums), where a zeros() each would
// launch a tiny fill kernel each, every layer, every step.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace slipstream::aero {

// One tensor per entry of `shapes`, fp32 on like's device, all zero, each
// contiguous, none overlapping another, each starting a multiple of 256
// bytes after the first (which is where the allocator puts it: on CUDA, a
// 512-byte boundary), as the kernels' vector loads and atomics need.
// They share one storage: a part kept (e.g. as a parameter's .grad) keeps
// the whole buffer alive, so keep the parts small.
std::vector<at::Tensor> zero_parts(const at::Tensor& like,
                                   const std::vector<std::vector<int64_t>>& shapes);

}  // namespace slipstream::aero
