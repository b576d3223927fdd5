// lt_matmul: a Linear layer's GEMM with a residual block's add done in
// cuBLASLt's epilogue, for linear.cpp's bf16 CUDA paths. It returns false
// (and leaves its output alone) where it does not apply: not a CUDA build, a
// LibTorch before 2.0, tensors not on CUDA, not bf16, not contiguous or not
// 16-byte aligned, widths not multiples of 8, or no cuBLASLt algorithm for
// the problem. The caller then does the two ops apart.
//
// On the H200 at 200k rows (bench/lt_matmul_bench) the add then costs the
// GEMM the read of r alone: 448 -> 448 with the residual 0.192 ms against
// 0.283 for linear + add; 1792 -> 448: 0.504 against 0.564.
//
// The same epilogue's bias gradient (BGRADB: the column sums of the output
// gradient summed in the weight gradient's GEMM) was measured and left out:
// 0.464 ms against 0.237 for the GEMM and column_sum apart (448 x 448), and
// 0.714 against 0.513 (448 x 1792).
#pragma once

#include <ATen/core/Tensor.h>

namespace slipstream::aero::lt_matmul {

// y (rows, out) = x (rows, in) w^T + b + r: x, w (out, in), b (out) and r
// (rows, out) bf16, r read by the GEMM's epilogue (beta = 1) and the sum
// rounded to bf16 once (the two ops apart round x w^T + b first).
bool linear_residual(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                     const at::Tensor& r, at::Tensor& y);

}  // namespace slipstream::aero::lt_matmul
