// The slice part of physics attention as four tensor operations, each of
// which recomputes the points x heads x slices weights from x_mid instead of
// reading them from memory (see kernels/slice_kernels.h for the maths). On
// CUDA with bf16 inputs and a supported head size / slice count they run the
// fused kernels; anywhere else the same decomposition in ATen ops, which is
// what the CPU tests check the autograd wiring with. Results documented as
// fp32 are fp64 on that path for fp64 inputs.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace slipstream::aero::slice_ops {

// The slice-weight inputs of one layer.
struct Weights {
  at::Tensor x;     // (B, N, H, D) x_mid
  at::Tensor ws;    // (G, D) in_project_slice.weight
  at::Tensor bias;  // (G) in_project_slice.bias
  at::Tensor tau;   // (H) the temperatures, clamped
};

// True when these inputs run the CUDA kernels (also false in a build
// without CUDA).
bool kernels_apply(const at::Tensor& x, int64_t slices);
// The same decided before x_mid exists: x_mid of this device and dtype,
// `dim` wide per head.
bool kernels_apply(c10::Device device, c10::ScalarType dtype, int64_t dim, int64_t slices);

// The head size the kernels run a head of `dim` at: the next of 16, 32, 56
// and 64 (dim itself above 64, where no kernel applies). A layer whose heads
// are narrower pads each head with zero columns to it: a zero column adds
// nothing to the slice logits and its slice tokens, outputs and gradients
// are zero, so the result is the unpadded one.
int64_t kernel_dim(int64_t dim);

struct FirstReduce {
  at::Tensor sums;    // (B, H, G, D) fp32: sum_n w y
  at::Tensor colsum;  // (B, H, G) fp32:    sum_n w
  at::Tensor lse;     // (B, H, N) fp32: the weights' log-normaliser per point
};
// The forward's slice sums of y (fx_mid), computing lse on the way.
FirstReduce reduce_first(const Weights& in, const at::Tensor& y);
// sum_n w y with a known lse: (B, H, G, D) fp32.
at::Tensor reduce(const Weights& in, const at::Tensor& lse, const at::Tensor& y);
// sum_g w z, z (B, H, G, D): (B, N, H, D) in x's dtype.
at::Tensor expand(const Weights& in, const at::Tensor& lse, const at::Tensor& z);

struct BackwardResult {
  at::Tensor grad_x, grad_fx;  // (B, N, H, D) in x's dtype
  at::Tensor grad_ws;          // (G, D) fp32
  at::Tensor grad_bias;        // (G) fp32
  at::Tensor tau_acc;          // (H) fp32: sum of dL/dz * z per head
};
// See slice_kernels::backward: gout (B,N,H,D), os and gs (B,H,G,D), gnorm
// (B,H,G). gout and os undefined: no deslice (slice tokens alone), their
// term of dL/dw left out.
BackwardResult backward(const Weights& in, const at::Tensor& lse, const at::Tensor& fx,
                        const at::Tensor& gout, const at::Tensor& os, const at::Tensor& gs,
                        const at::Tensor& gnorm);

// grad_ws (G, D) and grad_bias (G), fp32, from the (G, D + 8) product
// dlogits^T x_ext whose rows and columns are in the kernels' orders
// (slice_kernels.h: dlogits_column, x_ext_column), as backward forms it
// where the row kernel writes dL/dlogits. D 56 or 64, G a multiple of 32;
// anything else is an error.
struct WeightGrads {
  at::Tensor grad_ws, grad_bias;
};
WeightGrads weight_grads_from_product(const at::Tensor& product, int64_t dim);

}  // namespace slipstream::aero::slice_ops
