// CUDA kernels for the slice part of physics attention (Transolver), for one
// layer, on bf16 inputs with fp32 accumulation. Plain C++ interface: raw
// device pointers and a cudaStream_t passed as void*, so that this header
// needs neither CUDA nor Torch; slice_ops.h wraps it for tensors.
//
// Per (batch b, head h), with D = dim_head, G = slices and tau_h the clamped
// temperature:
//   z[n,g]  = (x[n,:] . ws[g,:] + bias[g]) / tau_h          (slice logits)
//   lse[n]  = log sum_g exp(z[n,g]);   w[n,g] = exp(z[n,g] - lse[n])
// No kernel stores w: each recomputes it from x and the per-point lse, 16
// points at a time, in registers.
//
// Layouts (all contiguous, row-major): x, y, fx, gout, out, grad_x, grad_fx:
// (B, N, H, D) bf16; ws: (G, D) bf16; bias: (G) fp32; tau: (H) fp32;
// lse: (B, H, N) fp32; z, os, gs: (B, H, G, D) bf16; acc: (B, H, G, D) fp32;
// colsum, gnorm: (B, H, G) fp32; grad_ws: (G, D) fp32; grad_bias: (G) fp32;
// tau_acc: (H) fp32; out, grad_x and grad_fx 16-byte aligned (the row
// kernels write 16-byte pieces of rows; an error otherwise). Accumulating
// outputs (acc, colsum, grad_ws, grad_bias, tau_acc) are added to with
// atomics: the caller zeroes them. Every launch is asynchronous on
// `stream`; nothing here synchronizes.
//
// On Hopper (sm_90a) the kernels form their products with wgmma where that
// measured faster (wgmma.cuh): lse, expand and the backward's first kernel
// (a warpgroup on 64 points), the reduce above dim_head 32 and the weight
// gradient at 32 and below (a warpgroup on 64 slices); elsewhere, or after
// set_mma_only(true) (numerics.slice_kernels: mma, for measurements), with
// mma.sync, a warp on 16 points or slices. Both give the same sums up to
// fp32 rounding order.
#pragma once

#include <cstdint>

namespace slipstream::aero::slice_kernels {

struct Problem {
  int64_t batch = 1, points = 0, heads = 0, dim = 0, slices = 0;
  const void* x = nullptr;      // (B, N, H, D) bf16
  const void* ws = nullptr;     // (G, D) bf16
  const float* bias = nullptr;  // (G)
  const float* tau = nullptr;   // (H), already clamped
  float* lse = nullptr;         // (B, H, N)
  void* stream = nullptr;       // cudaStream_t
};

// True when the kernels handle this head size and slice count
// (dim_head 16, 32, 56 or 64; slices a multiple of 16, at most 256).
bool supported(int64_t dim, int64_t slices);

// acc[b,h,g,:] += sum_n w[n,g] y[n,:]; colsum[b,h,g] += sum_n w[n,g] when
// colsum is not null. With compute_lse, lse is computed and written first;
// otherwise it is read.
void reduce(const Problem& p, const void* y, float* acc, float* colsum, bool compute_lse);

// out[n,:] = sum_g w[n,g] z[g,:]  (bf16 out).
void expand(const Problem& p, const void* z, void* out);

// The backward of slice -> (attention among slices) -> deslice, after the
// slice-attention backward: given gout = dL/d(out), os (the attention's
// output), gs = dL/dS (S the un-normalised slice sums) and gnorm =
// dL/d(sum_n w), it forms dL/dw = gout os^T + fx gs^T + gnorm, the softmax
// backward, and writes grad_x, grad_fx, adds to grad_ws, grad_bias and
// tau_acc[h] += sum (dL/dz) * z (the caller turns it into dL/dtau). dot:
// (B, H, N) fp32 scratch (the per-point sum_g w dL/dw, passed from the
// kernel that forms grad_x to the one that forms grad_ws and grad_bias).
// gout and os both null: no deslice (a context projector's slice tokens),
// dL/dw = fx gs^T + gnorm.
// dlogits and x_ext: both null, or (where writes_dlogits(p)) a (B, N, H, G)
// and a (B, N, H, D + 8) bf16 buffer that the kernel forming grad_x fills
// with dL/dlogits = dL/dz / tau (the bf16 values its own product takes) and
// with x, a one and seven zeros a row, each row's columns in the order of
// dlogits_column and x_ext_column below. grad_ws and grad_bias are then
// left alone (may be null), for the caller to read from one GEMM over the
// B N H rows, dlogits^T x_ext, a (G, D + 8) matrix in those orders: its
// columns 0 .. D - 1 are grad_ws, column D grad_bias (slice_ops.cpp: a
// library GEMM rather than a kernel that recomputes the weights once more).
void backward(const Problem& p, const void* fx, const void* gout, const void* os, const void* gs,
              const float* gnorm, void* grad_x, void* grad_fx, float* grad_ws, float* grad_bias,
              float* tau_acc, float* dot, void* dlogits = nullptr, void* x_ext = nullptr);

// How backward's callers get grad_ws and grad_bias at head sizes above 32
// on Hopper: gemm (the default), from the dlogits the row kernel writes;
// kernel, the weight-gradient kernel that recomputes them
// (numerics.slice_weight_grad, set by set_weight_grad_mode).
enum class WeightGrad { gemm, kernel };
WeightGrad weight_grad_mode();
void set_weight_grad_mode(WeightGrad mode);

// Whether the mma.sync kernels run on Hopper too (numerics.slice_kernels:
// mma); false (the default) takes the wgmma ones there.
void set_mma_only(bool mma_only);
bool mma_only();

// Where dlogits and x_ext keep a row's columns: in the order that lets each
// lane of the row kernel write its fragment values as 16 contiguous bytes
// (mma's A layout: lane 4 r + q holds columns 8 m + 2 q + {0, 1}).
// dlogits: in each run of 32 slices, slice 8 m + 2 q + e (m, q < 4, e < 2)
// at 8 q + 2 m + e. x_ext (D 56 or 64): in each run of 32 of its first 64
// columns, column 16 k + 8 m + 2 q + e (k, m, e < 2, q < 4) at
// 8 q + 4 k + 2 m + e; columns 64 .. 71 (D 64) in place.
constexpr int64_t dlogits_column(int64_t slice) {
  const int64_t s = slice % 32, m = s / 8, q = (s % 8) / 2, e = s % 2;
  return slice - s + 8 * q + 2 * m + e;
}
constexpr int64_t x_ext_column(int64_t col) {
  if (col >= 64) return col;
  const int64_t c = col % 32, k = c / 16, m = (c % 16) / 8, q = (c % 8) / 2, e = c % 2;
  return col - c + 8 * q + 4 * k + 2 * m + e;
}

// Whether backward() takes dlogits for this problem: the gemm mode, the
// wgmma row kernel with batches of 32 slices (sm_90a, head size 56 or 64,
// G a multiple of 32). At head size 32 and below the weight-gradient
// kernel is kept.
bool writes_dlogits(const Problem& p);

}  // namespace slipstream::aero::slice_kernels
