// y = x W^T + b as one autograd function, for the model's Linear layers.
// Forward: one GEMM with the bias folded in, under CUDA autocast on x, W and
// b cast to the autocast dtype as autocast would. Backward: two GEMMs for x
// and W. On CUDA for bf16 every GEMM runs where lt_matmul::mm takes it, on
// cuBLASLt with its algorithm timed once per problem, else on ATen's. The
// bias gradient is summed in fp32: on CUDA for a bf16 gradient by
// column_sum_kernels (two deterministic passes) or taken from whoever
// offered the sums (offer_column_sums below), elsewhere
// over a wide view of the output gradient: (M, C) is summed as (M / f, f C)
// and then over the f groups, since ATen's own sum over M of a narrow
// (M, C) bf16 gradient reaches a small part of the memory bandwidth.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace slipstream::aero {

// x (..., in), weight (out, in), bias (out) or undefined: (..., out).
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// linear(x, weight, bias) + residual, residual (..., out) or undefined (then
// linear alone). On CUDA for bf16 one GEMM adds the residual in its epilogue
// (lt_matmul.h), rounding the sum to bf16 once; elsewhere the two ops, so
// on the CPU bitwise theirs. residual's gradient is the output's.
at::Tensor linear_residual(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           const at::Tensor& residual);

// linear(x, w1, b1) and linear(x, w2, b2) of one x (two projections of
// it), the same values as the two apart; in the backward x's gradient is
// made in one buffer, the second product accumulated into the first by the
// GEMM, rather than two summed by autograd. Both biases defined.
std::pair<at::Tensor, at::Tensor> linear_pair(const at::Tensor& x, const at::Tensor& w1,
                                              const at::Tensor& b1, const at::Tensor& w2,
                                              const at::Tensor& b2);

// linear(gelu(h), weight, bias) (exact, erf GELU) keeping h alone for the
// backward, which recomputes gelu(h) for the weight gradient: an MLP's
// hidden layer is then kept once (h) rather than twice (h for GELU's
// backward and gelu(h) for the next Linear's). The same ops as the two
// apart, so on the CPU the same values bitwise; on CUDA for bf16, GELU's
// backward and its recompute run as one pass (gelu_kernels.h).
at::Tensor gelu_linear(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias);

// linear(gelu(linear(x, w1, b1)), w2, b2): an MLP of one hidden layer as
// linear and gelu_linear make it (x and the hidden layer h kept, GELU
// recomputed in the backward), the same ops and so on the CPU the same
// values bitwise; on CUDA for bf16 the backward's GELU pass also sums h's
// gradient into b1's (gelu_kernels.h), which then differs from the two
// apart by fp32 summation order alone. Under precision: fp8, where
// fp8::applies(x, w1): fp8::gelu_mlp (fp8_linear.h) where it takes the
// MLP, else the Linears apart (each in fp8 where it can be). Both biases
// defined.
at::Tensor gelu_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1,
                    const at::Tensor& w2, const at::Tensor& b2);

// gelu_mlp(x, w1, b1, w2, b2) + residual, as linear_residual adds it (one
// GEMM on CUDA for bf16); residual undefined: gelu_mlp alone. keep_gelu:
// gelu(h) is kept for the backward too (one more hidden layer of memory),
// which then reads it rather than recomputing it: the same values, and on
// CUDA the backward's GELU pass writes one (rows, hidden) tensor less.
at::Tensor gelu_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1,
                    const at::Tensor& w2, const at::Tensor& b2, const at::Tensor& residual,
                    bool keep_gelu = false);

// The sum over rows of a (rows, width) tensor, accumulated in fp32 (fp64
// for fp64 input), as described above: (width).
at::Tensor column_sum(const at::Tensor& m);

// Column sums made by whoever made a gradient, offered to the Linear whose
// output it is the gradient of: a backward that produces `grad` and has its
// sums over rows at hand (the LayerNorm kernels' backward, which reads every
// value anyway) offers them, and the Linear's backward takes them as its
// bias gradient instead of summing the gradient again (column_sum).
// An offer holds for that very tensor alone (not a view or a copy of it),
// while it is alive and unchanged (its version counter): a gradient that
// autograd summed from several uses, or changed in place, is a new or
// changed tensor, and the Linear sums it itself. A Linear that takes an
// offer withdraws it. Offers are kept per thread
// (autograd runs a device's backward on one thread), the last few only.
// sums: (grad.size(-1)), fp32.
void offer_column_sums(const at::Tensor& grad, const at::Tensor& sums);

// The sums offered for `grad`, or an undefined tensor.
at::Tensor offered_column_sums(const at::Tensor& grad);

// A Linear's bias gradient, as `dtype`: the sums offered for `grad` (its
// output's gradient as autograd passed it in), taking the offer, else
// column_sum(g), g being grad's values as a (rows, out) matrix.
at::Tensor bias_gradient(const at::Tensor& grad, const at::Tensor& g, at::ScalarType dtype);

// How many times a Linear's backward took offered sums (for tests).
int64_t offered_column_sums_used();

}  // namespace slipstream::aero
