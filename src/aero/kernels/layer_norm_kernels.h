// CUDA kernels for LayerNorm over the last dimension of a bf16 tensor, with
// fp32 weight and bias, fp32 statistics and fp32 parameter gradients: the
// LayerNorm of a bf16 residual stream under autocast without casting it to
// fp32 and back. One warp per row; each lane holds width / 32 values.
// Rows must be 16-byte aligned for widths that are multiples of 256, 4-byte
// aligned otherwise.
// Plain C++ interface (raw device pointers, cudaStream_t as void*), like
// slice_kernels.h; fused_layer_norm.h wraps it for tensors.
//
// Per row r of width C:  mean_r = sum x / C,  rstd_r = 1 / sqrt(var_r + eps)
// (var the biased variance, computed from x - mean), y = (x - mean) rstd
// gamma + beta. Backward, with xhat = (x - mean) rstd and gg = gy gamma:
//   gx = rstd (gg - mean_C(gg) - xhat mean_C(gg xhat)) [+ gres]
//   ggamma += sum_r gy xhat,  gbeta += sum_r gy   (atomics: the caller zeroes)
//   gsum += sum_r gx   (of gx as stored, rounded to bf16; only where gsum is
//                       not null: the bias gradient of a Linear that wrote x)
// Layouts: x, y, gy, gx (rows, C) bf16 contiguous, 16-byte aligned; gamma,
// beta, ggamma, gbeta, gsum (C) fp32; mean, rstd (rows) fp32; gres (rows, C) bf16
// or null: the gradient of a residual path that also reads x, added in fp32
// before gx is rounded (one pass instead of a separate add). Asynchronous on
// `stream`; nothing here synchronizes.
#pragma once

#include <cstdint>

namespace slipstream::aero::layer_norm_kernels {

// Widths the kernels take: multiples of 64 up to 1024.
bool supported(int64_t width);

void forward(const void* x, const float* gamma, const float* beta, int64_t rows, int64_t width,
             float eps, void* y, float* mean, float* rstd, void* stream);

// forward() with y written only as the e4m3 copies an fp8 product reads
// (ops/fp8_linear.h): each value of y rounded to bf16 as forward() stores
// it, then as fp8_kernels::quantize() casts it, byte for byte: q =
// saturate(y scale[0]) into out (rows_out, C) and, unless null, out_t (C,
// rows_out), the rows from `rows` on zero; amax[0] becomes max(amax[0],
// max |y|) (+inf where a value is not finite). mean and rstd as forward()
// writes them. out null: neither copy (the amax and statistics alone).
// rows_out: a multiple of 16, at least rows; out and out_t 16-byte aligned.
void forward_e4m3(const void* x, const float* gamma, const float* beta, int64_t rows,
                  int64_t rows_out, int64_t width, float eps, const float* scale, uint8_t* out,
                  uint8_t* out_t, float* amax, float* mean, float* rstd, void* stream);

void backward(const void* gy, const void* x, const float* mean, const float* rstd,
              const float* gamma, const void* gres, int64_t rows, int64_t width, void* gx,
              float* ggamma, float* gbeta, float* gsum, void* stream);

}  // namespace slipstream::aero::layer_norm_kernels
