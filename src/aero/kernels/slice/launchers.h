// The slice kernels' launches, one function per kernel, each defined beside
// its kernel (sm80_*.cu: mma.sync, every GPU since Ampere; sm90_*.cu:
// wgmma, Hopper) and called by launch.cu, which picks among them.
#pragma once

#include "aero/kernels/common/launch.h"
#include "aero/kernels/slice/slice_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace slipstream::aero::slice_kernels::detail {

inline void check_launch(const char* what) { kernels::check_launch("slice kernels", what); }

inline cudaStream_t stream_of(const Problem& p) { return static_cast<cudaStream_t>(p.stream); }

// One wave: at most as many blocks as fit on the device at once, each
// taking an equal run of tiles of its (batch, head).
template <typename Kernel>
dim3 launch_grid(Kernel kernel, int threads, size_t smem, const Problem& p, int* tiles_per_block,
                 int tile, int splits = 1) {
  kernels::check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)),
                      "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize)");
  int per_sm = 0;
  kernels::check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem),
                      "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  if (per_sm < 1) per_sm = 1;
  const int64_t heads = p.batch * p.heads;
  const int64_t tiles = (p.points + tile - 1) / tile;
  // Rounded down: a block past the wave would double the kernel's time.
  int64_t chunks = int64_t(kernels::sm_count()) * per_sm / (heads * splits);
  chunks = std::max<int64_t>(1, std::min(chunks, tiles));
  const int64_t per = (tiles + chunks - 1) / chunks;
  *tiles_per_block = static_cast<int>(per);
  return dim3(static_cast<unsigned>((tiles + per - 1) / per), static_cast<unsigned>(heads),
              static_cast<unsigned>(splits));
}

// backward's operands (slice_kernels.h), as the kernels take them.
struct BackwardArgs {
  const __nv_bfloat16 *fx, *gout, *os, *gs;
  const float* gnorm;
  __nv_bfloat16 *grad_x, *grad_fx;
  float *grad_ws, *grad_bias, *tau_acc, *dot;
  __nv_bfloat16 *dlogits, *x_ext;
};

// sm80_forward.cu, every head size.
template <int D>
void launch_lse(const Problem& p);
template <int D>
void launch_reduce(const Problem& p, const __nv_bfloat16* y, float* acc, float* colsum);
template <int D>
void launch_expand(const Problem& p, const __nv_bfloat16* z, __nv_bfloat16* out);

// sm90_forward.cu: lse and expand at every head size, reduce above 32.
template <int D>
void launch_lse_wg(const Problem& p);
template <int D>
void launch_reduce_wg(const Problem& p, const __nv_bfloat16* y, float* acc, float* colsum);
template <int D>
void launch_expand_wg(const Problem& p, const __nv_bfloat16* z, __nv_bfloat16* out);

// sm80_backward.cu, every head size, with and without a deslice.
template <int D, bool kDeslice>
void launch_backward(const Problem& p, const BackwardArgs& a);
template <int D, bool kDeslice>
void launch_weight_grad(const Problem& p, const BackwardArgs& a);

// sm90_backward.cu: the backward in batches of C slices with W warps a
// block (16/8 at every head size; 32/12 above 32, also writing dlogits;
// 32/8 at 32 and below; kPipe, batches in pairs, one block an SM: 32/8
// above 32, writing dlogits), the weight gradient at 32 and below.
template <int D, bool kDeslice, int C, int W, bool kDlogits, bool kPipe>
void launch_backward_wg(const Problem& p, const BackwardArgs& a);
template <int D, bool kDeslice>
void launch_weight_grad_wg(const Problem& p, const BackwardArgs& a);

}  // namespace slipstream::aero::slice_kernels::detail
