// Physics attention's slice -> attention among slices -> deslice (and
// GALE's slice -> self- and cross-attention -> deslice) as one autograd
// function that keeps no points x heads x slices tensor: the
// forward keeps x_mid, fx_mid and one log-normaliser per point and head; the
// backward recomputes the slice weights (slice_ops.h). The plain module path
// (PhysicsAttentionImpl with fused_attention off) is the reference it is
// tested against.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace slipstream::aero {

// The slice weights of one layer.
struct SliceParams {
  at::Tensor slice_weight;  // in_project_slice.weight (G, D)
  at::Tensor slice_bias;    // in_project_slice.bias (G)
  at::Tensor temperature;   // (1, 1, H, 1), clamped to [0.5, 5] inside
  double eps = 1e-2;        // added to the slice weights' sum over points
};

// What a layer does among its slice tokens: tokens (B, H, G, D) -> mixed
// tokens (B, H, G, D). It is called once, in the forward, with grad on and
// with detached copies of `leaves` (the weights and other inputs it reads
// that want gradients, in the order given); the backward differentiates the
// small graph it built. It must read no other tensor that wants a gradient.
using TokenMixer =
    std::function<at::Tensor(const at::Tensor& tokens, const std::vector<at::Tensor>& leaves)>;

// slice -> mix -> deslice: x_mid, fx_mid (B, N, H, D) -> (B, N, H, D),
// before the heads are merged and out_linear applied. Gradients flow to
// x_mid, fx_mid, the slice weights, the temperature and every leaf.
at::Tensor fused_slice_mix(const at::Tensor& x_mid, const at::Tensor& fx_mid,
                           const SliceParams& params, const TokenMixer& mix,
                           const std::vector<at::Tensor>& leaves);

// The slice tokens alone (GeoTransolver's context projectors): x_mid,
// fx_mid (B, N, H, D) -> (w / (sum_n w + eps))^T fx_mid (B, H, G, D) fp32,
// with no points x heads x slices tensor kept for the backward.
at::Tensor fused_slice_tokens(const at::Tensor& x_mid, const at::Tensor& fx_mid,
                              const SliceParams& params);

struct SliceAttentionParams {
  at::Tensor slice_weight;  // in_project_slice.weight (G, D)
  at::Tensor slice_bias;    // in_project_slice.bias (G)
  at::Tensor temperature;   // (1, 1, H, 1), clamped to [0.5, 5] inside
  at::Tensor qkv_weight;    // qkv_project.weight (3D, D)
  double eps = 1e-2;        // added to the slice weights' sum over points
};

// Transolver's physics attention: fused_slice_mix with the attention among
// the slice tokens as the mix.
at::Tensor fused_physics_attention(const at::Tensor& x_mid, const at::Tensor& fx_mid,
                                   const SliceAttentionParams& params);

// Attention among the slice tokens (B, H, G, D): q, k, v = tokens Wqkv^T,
// then softmax(q k^T / sqrt(D)) v. Shared by the plain and fused paths.
at::Tensor slice_token_attention(const at::Tensor& tokens, const at::Tensor& qkv_weight);

}  // namespace slipstream::aero
