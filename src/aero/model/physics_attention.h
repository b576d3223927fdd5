// Physics attention's slicing on the plain LibTorch path, the one
// implementation behind Transolver's PhysicsAttention, GeoTransolver's GALE
// and its context projectors. Per head, with x_mid, fx_mid (B, N, H, D) the
// two input projections:
//   w = softmax(Ws x_mid / clamp(tau, 0.5, 5)) over the S slices  (B, N, H, S)
//   tokens = (w^T fx_mid) / (sum_N w + eps)                        (B, H, S, D)
//   deslice: y = w t for attended tokens t                         (B, N, H, D)
// On CUDA the fused kernels (fused_physics_attention.h) run the same maths
// without the (B, N, H, S) tensor; this path is their reference, and the
// one that sums over a domain group's points (domain_parallel.h).
#pragma once

#include "core/distributed/communicator.h"

#include <torch/nn/modules/linear.h>

namespace slipstream::aero {

// PhysicsNeMo writes the slicing two ways, and each family follows its own
// so that its outputs match PhysicsNeMo's:
//   kTransolver: logits / tau in the promoted dtype (fp32 under autocast),
//     the tokens as the sum over points divided by the norm;
//   kGale: logits / tau in the logits' dtype, the tokens as one product
//     (w / norm)^T fx_mid (under a domain group: as kTransolver, since the
//     sums must be taken over every rank first).
enum class SliceForm { kTransolver, kGale };

// A layer's slicing parameters: in_project_slice (D -> S), temperature
// (1, 1, H, 1), the norm's eps.
struct SliceProjection {
  const torch::nn::LinearImpl& in_project_slice;
  const torch::Tensor& temperature;
  double eps;
  SliceForm form;
};

// The slice weights w (B, N, H, S) of x_mid.
torch::Tensor slice_weights(const SliceProjection& s, const torch::Tensor& x_mid);

struct Slices {
  torch::Tensor weights;  // (B, N, H, S)
  torch::Tensor tokens;   // (B, H, S, D)
};

// w and the normalised slice tokens of x_mid, fx_mid; under a domain group
// x_mid, fx_mid are this rank's shard of the points and both sums are taken
// over the group's.
Slices slice(const SliceProjection& s, const torch::Tensor& x_mid, const torch::Tensor& fx_mid,
             Communicator* group);

// For slicing in chunks of points: adds a chunk's sums to norm (B, H, S)
// and token (B, H, S, D), in fp32 (allocated on the first chunk).
void accumulate_slices(const SliceProjection& s, const torch::Tensor& x_mid,
                       const torch::Tensor& fx_mid, torch::Tensor& norm, torch::Tensor& token);

// accumulate_slices of x's two projections: x (autocast_input) through
// in_project_x and in_project_fx, each viewed as `heads` heads.
void accumulate_projected(const SliceProjection& s, const torch::nn::LinearImpl& in_project_x,
                          const torch::nn::LinearImpl& in_project_fx, int64_t heads,
                          const torch::Tensor& x, torch::Tensor& norm, torch::Tensor& token);

// The tokens of the accumulated sums: token / (norm + eps).
torch::Tensor tokens_of(const torch::Tensor& norm, const torch::Tensor& token, double eps);

// The attended tokens (B, H, S, D) back to the points: (B, N, H, D).
torch::Tensor deslice(const torch::Tensor& w, const torch::Tensor& tokens);

}  // namespace slipstream::aero
