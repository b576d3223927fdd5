// fused_layer_norm: the model's LayerNorm under bf16 autocast (TransolverOptions::
// bf16_layer_norm): bf16 in, bf16 out, fp32 statistics, weight and bias kept
// in fp32, parameter gradients summed in fp32. On CUDA, for a bf16 input
// whose width the kernels take (kernels/layer_norm_kernels.h: multiples of
// 64 up to 1024) it is one autograd function over those kernels, which
// keep the mean and 1/std per row for the backward. Anywhere else it is
// layer_norm_in_autocast_dtype (numerics.h): the same in ATen ops, with
// weight and bias rounded to bf16 under autocast, at::layer_norm otherwise.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace slipstream::aero {

at::Tensor fused_layer_norm(const at::Tensor& x, at::IntArrayRef shape, const at::Tensor& weight,
                            const at::Tensor& bias, double eps);

// {fused_layer_norm(x, ...), r}, r equal to x, for a residual block that
// adds x back to what it makes of the norm (y = f(norm) + r). On the
// kernels' path r is an output of the same autograd function, so the
// residual's gradient is added to the LayerNorm's input gradient inside the
// LayerNorm's backward kernel, before the one rounding to bf16 — instead of
// autograd summing the two in a separate pass over the (rows, C) tensors.
// Elsewhere r is x itself, and the result is bitwise that of the two ops.
std::pair<at::Tensor, at::Tensor> fused_layer_norm_residual(const at::Tensor& x,
                                                            at::IntArrayRef shape,
                                                            const at::Tensor& weight,
                                                            const at::Tensor& bias, double eps);

// Whether fused_layer_norm(x, {x.size(-1)}, weight, bias) runs the CUDA
// kernels (false in a build without CUDA).
bool layer_norm_kernels_apply(const at::Tensor& x, const at::Tensor& weight,
                              const at::Tensor& bias);

// The kernels' path in pieces, for a function that runs the LayerNorm
// inside its own (fp8_linear.h's norm_linear_pair and norm_gelu_mlp, which
// write its output only in fp8). CUDA builds; elsewhere they throw.
// x as the kernels take it: bf16, contiguous, 16-byte aligned (a copy where
// it is not).
at::Tensor layer_norm_kernels_input(const at::Tensor& x);
// The backward of a LayerNorm whose forward the kernels ran on x (as
// layer_norm_kernels_input made it) with `weight` (fp32), keeping mean and
// rstd: x's gradient from gy (the output's, or undefined) with gres (a
// residual path's, or undefined) added in the same kernel, and the
// weight's and bias's (fp32). x's gradient's column sums are offered
// (linear.h) to the Linear that wrote x, as its bias gradient.
struct LayerNormGradients {
  at::Tensor x, weight, bias;
};
LayerNormGradients layer_norm_kernels_backward(const at::Tensor& x, const at::Tensor& weight,
                                               const at::Tensor& mean, const at::Tensor& rstd,
                                               const at::Tensor& gy, const at::Tensor& gres);

}  // namespace slipstream::aero
