// lt_matmul: the bf16 GEMMs of linear.cpp's CUDA paths on cuBLASLt, each
// problem's algorithm timed rather than guessed, and a Linear layer's GEMM
// with a residual block's add done in cuBLASLt's epilogue. It returns false
// (and leaves its output alone) where it does not apply: not a CUDA build, a
// LibTorch before 2.0, tensors not on CUDA, not bf16, not contiguous or not
// 16-byte aligned, widths not multiples of 8, or no cuBLASLt algorithm for
// the problem. The caller then does the two ops apart.
//
// Tuning (numerics.gemm=tuned) times cuBLASLt's candidate algorithms for
// each problem once and keeps the fastest, against ATen's GEMM too; its
// own 32 MiB workspace, since PyTorch's 1 MiB one halves the rate of the
// fp32-output weight gradients. numerics.gemm_report prints each pick.
//
// The residual's add in the epilogue costs the GEMM the read of r alone,
// where linear + add reads and writes the output once more
// (bench/lt_matmul_bench). The same epilogue's bias gradient (BGRADB) is
// not used: it was slower than the GEMM and column_sum apart.
#pragma once

#include <ATen/core/Tensor.h>

namespace slipstream::aero::lt_matmul {

// How a problem's algorithm is picked (numerics.gemm, set by build_run):
//   tuned (the default): the fastest of the first 16 that cuBLASLt's
//     heuristic offers, each timed on the problem's first use (shape,
//     layouts, alignment, device), which synchronises the device then, once;
//     a first use inside a CUDA graph capture, where nothing can be timed,
//     takes the heuristic's first and tunes on the next use outside one.
//     set_report(true) (numerics.gemm_report) prints each problem's times
//     as it is tuned.
//   heuristic: the heuristic's first.
//   aten: mm() declines, so its callers use ATen's GEMMs (scaled_mm too,
//     for a product with neither bias nor c); linear_residual still runs
//     on cuBLASLt with the heuristic's first (the code before tuning, for
//     measurements).
// Tuned, ATen's GEMM of the same product is one more candidate: where it is
// the fastest, mm() declines that problem. Without CUDA: aten.
enum class Mode { tuned, heuristic, aten };
Mode mode();
// Sets the mode for later calls; each mode keeps its own picks.
void set_mode(Mode m);
void set_report(bool on);

// out (M, N) = a (M, K) b (K, N) [+ bias (N)] [+ c (M, N)]: a and b bf16 on
// one CUDA device, 2-D, each with a unit stride in one dimension (a
// transposed view is taken as it is), leading dimensions multiples of 8 and
// data 16-byte aligned, N a multiple of 8; bias bf16 (only for a bf16 out)
// or undefined; c contiguous of out's type or undefined (c may be out
// itself: the product is then accumulated in place). out: undefined (then
// allocated) or contiguous (M, N); its type out_dtype, bf16 or fp32
// (accumulated in fp32 either way). False, out untouched, where it does not
// apply or (tuned) ATen's GEMM was the faster for the problem.
bool mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias, const at::Tensor& c,
        at::Tensor& out, at::ScalarType out_dtype);

// y (rows, out) = x (rows, in) w^T + b + r: x, w (out, in), b (out) and r
// (rows, out) bf16, r read by the GEMM's epilogue (beta = 1) and the sum
// rounded to bf16 once (the two ops apart round x w^T + b first).
bool linear_residual(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                     const at::Tensor& r, at::Tensor& y);

// The fp8 product (precision: fp8): out (M, N) = (scale_a a) (scale_b b)
// [+ bias (N)] [+ c (M, N)], accumulated in fp32: a (M, K) e4m3 or e5m2
// with unit stride along K, b (K, N) e4m3 or e5m2 (not both e5m2) with unit
// stride along K (a row-major (N, K) transposed), K, N and both leading
// dimensions multiples of 16, data 16-byte aligned; scale_a, scale_b one
// fp32 each on the device, 16-byte aligned, read by the GEMM (no sync);
// bias, c and out as for mm(). fast_accum: cuBLASLt's fp8 fast
// accumulation (fewer promotions to fp32 along K). Each problem's algorithm
// picked as for mm(), with no ATen candidate. False, out untouched, where
// it does not apply: the caller then runs ATen's _scaled_mm and adds c.
bool scaled_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
               const at::Tensor& scale_b, const at::Tensor& bias, const at::Tensor& c,
               at::Tensor& out, at::ScalarType out_dtype, bool fast_accum);

}  // namespace slipstream::aero::lt_matmul
