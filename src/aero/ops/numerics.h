// Numerics helpers the models share under bf16 autocast: one cast of an
// input that several layers read, and a LayerNorm that stays in bf16.
#pragma once

#include <ATen/core/Tensor.h>

namespace slipstream::aero {

// `x` cast to the autocast dtype when CUDA autocast is on and x is a
// floating CUDA tensor of another dtype; else x itself. For a tensor that
// several autocast layers read: one cast (and, backward, one cast of the
// summed gradient) instead of one per layer.
at::Tensor autocast_input(const at::Tensor& x);

// LayerNorm over the last dims (`shape`) that stays in the autocast dtype:
// under CUDA autocast, for an x already in that dtype (bf16), runs the
// layer norm on x as it is, with weight and bias rounded to that dtype (the
// kernel keeps its mean and variance in fp32), and returns bf16. Autocast's
// own policy would cast x to fp32, normalise in fp32, return fp32, and the
// next layer would cast back: three passes over the activations each way
// where this makes one. Elsewhere (CPU, no autocast, x of another dtype)
// it is at::layer_norm under the usual rules.
at::Tensor layer_norm_in_autocast_dtype(const at::Tensor& x, at::IntArrayRef shape,
                                        const at::Tensor& weight, const at::Tensor& bias,
                                        double eps);

// softmax(q k^T / sqrt(D)) v over the last two dims, D = q.size(-1):
// LibTorch's scaled_dot_product_attention where it has one (2.x), else the
// same in matmuls.
at::Tensor dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

}  // namespace slipstream::aero
