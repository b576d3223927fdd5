// LayerNorm kernels: see layer_norm_kernels.h. A row of C = 256 V bf16 values
// is V 16-byte pieces per lane: lane l holds columns v 256 + 8 l + e
// (v < V, e < 8), so that every load and store is a whole 512-byte run per
// warp. Each warp walks rows with a grid stride, two at a time.
#include "aero/model/kernels/launch.h"
#include "aero/model/kernels/layer_norm_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace slipstream::aero::layer_norm_kernels {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256, kWarps = kThreads / 32, kRowsPerStep = 2;

__device__ inline float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

union Piece {
  uint4 u;
  __nv_bfloat162 h[4];
};

template <int V>
__device__ inline void load_row(const bf16* row, int lane, float (&v)[V][8]) {
#pragma unroll
  for (int i = 0; i < V; ++i) {
    Piece p;
    p.u = *reinterpret_cast<const uint4*>(row + i * 256 + lane * 8);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __bfloat1622float2(p.h[e]);
      v[i][2 * e] = f.x;
      v[i][2 * e + 1] = f.y;
    }
  }
}

template <int V>
__device__ inline void store_row(bf16* row, int lane, const float (&v)[V][8]) {
#pragma unroll
  for (int i = 0; i < V; ++i) {
    Piece p;
#pragma unroll
    for (int e = 0; e < 4; ++e) p.h[e] = __floats2bfloat162_rn(v[i][2 * e], v[i][2 * e + 1]);
    *reinterpret_cast<uint4*>(row + i * 256 + lane * 8) = p.u;
  }
}

template <int V>
__device__ inline void load_params(const float* src, int lane, float (&v)[V][8]) {
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const float4 a = *reinterpret_cast<const float4*>(src + i * 256 + lane * 8);
    const float4 b = *reinterpret_cast<const float4*>(src + i * 256 + lane * 8 + 4);
    v[i][0] = a.x, v[i][1] = a.y, v[i][2] = a.z, v[i][3] = a.w;
    v[i][4] = b.x, v[i][5] = b.y, v[i][6] = b.z, v[i][7] = b.w;
  }
}

template <int V>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const bf16* __restrict__ x, const float* __restrict__ gamma,
                   const float* __restrict__ beta, int64_t rows, float eps, bf16* __restrict__ y,
                   float* __restrict__ mean_out, float* __restrict__ rstd_out) {
  constexpr int C = 256 * V;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * kWarps;
  float g[V][8], b[V][8];
  load_params<V>(gamma, lane, g);
  load_params<V>(beta, lane, b);
  for (int64_t r0 = (int64_t(blockIdx.x) * kWarps + threadIdx.x / 32) * kRowsPerStep; r0 < rows;
       r0 += warps * kRowsPerStep) {
    float v[kRowsPerStep][V][8];
#pragma unroll
    for (int k = 0; k < kRowsPerStep; ++k) {
      if (r0 + k < rows) load_row<V>(x + (r0 + k) * C, lane, v[k]);
    }
#pragma unroll
    for (int k = 0; k < kRowsPerStep; ++k) {
      if (r0 + k >= rows) break;
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < V; ++i)
#pragma unroll
        for (int e = 0; e < 8; ++e) s += v[k][i][e];
      const float mean = warp_sum(s) * (1.0f / C);
      float q = 0.0f;
#pragma unroll
      for (int i = 0; i < V; ++i)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          v[k][i][e] -= mean;
          q += v[k][i][e] * v[k][i][e];
        }
      const float rstd = rsqrtf(warp_sum(q) * (1.0f / C) + eps);
#pragma unroll
      for (int i = 0; i < V; ++i)
#pragma unroll
        for (int e = 0; e < 8; ++e) v[k][i][e] = v[k][i][e] * rstd * g[i][e] + b[i][e];
      store_row<V>(y + (r0 + k) * C, lane, v[k]);
      if (lane == 0) {
        mean_out[r0 + k] = mean;
        rstd_out[r0 + k] = rstd;
      }
    }
  }
}

// The parameter gradients are summed per lane over the warp's rows, then
// over the block's warps in shared memory, then added to global memory.
template <int V>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(const bf16* __restrict__ gy, const bf16* __restrict__ x,
                    const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                    const float* __restrict__ gamma, int64_t rows, bf16* __restrict__ gx,
                    float* __restrict__ ggamma, float* __restrict__ gbeta) {
  constexpr int C = 256 * V;
  __shared__ float red[kWarps][C];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t warps = int64_t(gridDim.x) * kWarps;
  float g[V][8], dg[V][8] = {}, db[V][8] = {};
  load_params<V>(gamma, lane, g);
  for (int64_t r = int64_t(blockIdx.x) * kWarps + warp; r < rows; r += warps) {
    float xv[V][8], gv[V][8];
    load_row<V>(x + r * C, lane, xv);
    load_row<V>(gy + r * C, lane, gv);
    const float mean = mean_in[r], rstd = rstd_in[r];
    float a = 0.0f, c = 0.0f;
#pragma unroll
    for (int i = 0; i < V; ++i)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        xv[i][e] = (xv[i][e] - mean) * rstd;  // xhat
        dg[i][e] += gv[i][e] * xv[i][e];
        db[i][e] += gv[i][e];
        gv[i][e] *= g[i][e];  // gg
        a += gv[i][e];
        c += gv[i][e] * xv[i][e];
      }
    a = warp_sum(a) * (1.0f / C);
    c = warp_sum(c) * (1.0f / C);
#pragma unroll
    for (int i = 0; i < V; ++i)
#pragma unroll
      for (int e = 0; e < 8; ++e) gv[i][e] = rstd * (gv[i][e] - a - xv[i][e] * c);
    store_row<V>(gx + r * C, lane, gv);
  }
  for (int pass = 0; pass < 2; ++pass) {
    const auto& part = pass == 0 ? dg : db;
#pragma unroll
    for (int i = 0; i < V; ++i)
#pragma unroll
      for (int e = 0; e < 8; ++e) red[warp][i * 256 + lane * 8 + e] = part[i][e];
    __syncthreads();
    for (int col = threadIdx.x; col < C; col += kThreads) {
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += red[w][col];
      atomicAdd((pass == 0 ? ggamma : gbeta) + col, s);
    }
    __syncthreads();
  }
}

void check_launch(const char* what) { kernels::check_launch("layer norm kernels", what); }

using kernels::check_cuda;
using kernels::sm_count;

// Enough blocks to fill the device once (as many as fit on a
// multiprocessor at a time, at most max_per_sm), no more than rows need:
// each block then strides over an equal share of the rows.
template <typename Kernel>
unsigned grid_for(Kernel kernel, int64_t rows, int rows_per_warp, int max_per_sm) {
  int per_sm = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  per_sm = per_sm < 1 ? 1 : (per_sm > max_per_sm ? max_per_sm : per_sm);
  const int64_t rows_per_block = int64_t(kWarps) * rows_per_warp;
  const int64_t need = (rows + rows_per_block - 1) / rows_per_block;
  const int64_t cap = int64_t(sm_count()) * per_sm;
  return static_cast<unsigned>(need < cap ? (need > 0 ? need : 1) : cap);
}

template <int V>
void forward_v(const void* x, const float* gamma, const float* beta, int64_t rows, float eps,
               void* y, float* mean, float* rstd, cudaStream_t stream) {
  const unsigned grid = grid_for(forward_kernel<V>, rows, kRowsPerStep, 8);
  forward_kernel<V><<<grid, kThreads, 0, stream>>>(static_cast<const bf16*>(x), gamma, beta, rows,
                                                   eps, static_cast<bf16*>(y), mean, rstd);
  check_launch("forward");
}

template <int V>
void backward_v(const void* gy, const void* x, const float* mean, const float* rstd,
                const float* gamma, int64_t rows, void* gx, float* ggamma, float* gbeta,
                cudaStream_t stream) {
  // At most 4 blocks a multiprocessor: each ends with C atomics per parameter.
  const unsigned grid = grid_for(backward_kernel<V>, rows, 1, 4);
  backward_kernel<V><<<grid, kThreads, 0, stream>>>(static_cast<const bf16*>(gy),
                                                    static_cast<const bf16*>(x), mean, rstd, gamma,
                                                    rows, static_cast<bf16*>(gx), ggamma, gbeta);
  check_launch("backward");
}

void check_width(int64_t width) {
  if (!supported(width)) {
    throw std::invalid_argument("layer norm kernels: unsupported width " + std::to_string(width));
  }
}

}  // namespace

bool supported(int64_t width) { return width > 0 && width % 256 == 0 && width <= 1024; }

void forward(const void* x, const float* gamma, const float* beta, int64_t rows, int64_t width,
             float eps, void* y, float* mean, float* rstd, void* stream) {
  check_width(width);
  if (rows == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (width / 256) {
    case 1:
      return forward_v<1>(x, gamma, beta, rows, eps, y, mean, rstd, s);
    case 2:
      return forward_v<2>(x, gamma, beta, rows, eps, y, mean, rstd, s);
    case 3:
      return forward_v<3>(x, gamma, beta, rows, eps, y, mean, rstd, s);
    default:
      return forward_v<4>(x, gamma, beta, rows, eps, y, mean, rstd, s);
  }
}

void backward(const void* gy, const void* x, const float* mean, const float* rstd,
              const float* gamma, int64_t rows, int64_t width, void* gx, float* ggamma,
              float* gbeta, void* stream) {
  check_width(width);
  if (rows == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (width / 256) {
    case 1:
      return backward_v<1>(gy, x, mean, rstd, gamma, rows, gx, ggamma, gbeta, s);
    case 2:
      return backward_v<2>(gy, x, mean, rstd, gamma, rows, gx, ggamma, gbeta, s);
    case 3:
      return backward_v<3>(gy, x, mean, rstd, gamma, rows, gx, ggamma, gbeta, s);
    default:
      return backward_v<4>(gy, x, mean, rstd, gamma, rows, gx, ggamma, gbeta, s);
  }
}

}  // namespace slipstream::aero::layer_norm_kernels
