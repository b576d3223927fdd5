// LayerNorm kernels: see layer_norm_kernels.h. A row of C = 32 E V bf16
// values is V pieces of E values per lane: lane l holds columns v 32 E + E l
// + e (v < V, e < E), so that every load and store is a whole run of 32 E
// values per warp. E is 8 (16-byte pieces) for widths that are multiples of
// 256, else 2 (4-byte pieces: multiples of 64, GeoTransolver's 448). Each
// warp walks rows with a grid stride, two at a time.
#include "aero/kernels/common/fp8.cuh"
#include "aero/kernels/common/launch.h"
#include "aero/kernels/common/ptx.cuh"
#include "aero/kernels/layer_norm_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace slipstream::aero::layer_norm_kernels {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256, kWarps = kThreads / 32, kRowsPerStep = 2;

using kernels::warp_sum;

// E bf16 values, loaded and stored as one piece.
template <int E>
struct Piece;
template <>
struct Piece<8> {
  union {
    uint4 u;
    __nv_bfloat162 h[4];
  };
};
template <>
struct Piece<2> {
  union {
    uint32_t u;
    __nv_bfloat162 h[1];
  };
};

template <int V, int E>
__device__ inline void load_row(const bf16* row, int lane, float (&v)[V][E]) {
#pragma unroll
  for (int i = 0; i < V; ++i) {
    Piece<E> p;
    p.u = *reinterpret_cast<const decltype(p.u)*>(row + i * 32 * E + lane * E);
#pragma unroll
    for (int e = 0; e < E / 2; ++e) {
      const float2 f = __bfloat1622float2(p.h[e]);
      v[i][2 * e] = f.x;
      v[i][2 * e + 1] = f.y;
    }
  }
}

template <int V, int E>
__device__ inline void store_row(bf16* row, int lane, const float (&v)[V][E]) {
#pragma unroll
  for (int i = 0; i < V; ++i) {
    Piece<E> p;
#pragma unroll
    for (int e = 0; e < E / 2; ++e) p.h[e] = __floats2bfloat162_rn(v[i][2 * e], v[i][2 * e + 1]);
    *reinterpret_cast<decltype(p.u)*>(row + i * 32 * E + lane * E) = p.u;
  }
}

template <int V, int E>
__device__ inline void load_params(const float* src, int lane, float (&v)[V][E]) {
#pragma unroll
  for (int i = 0; i < V; ++i) {
#pragma unroll
    for (int e = 0; e < E; ++e) v[i][e] = src[i * 32 * E + lane * E + e];
  }
}

// A row's LayerNorm in place, v becoming (v - mean) rstd gamma + beta (in
// fp32, before any rounding), with its mean and 1 / std: one function for
// both forward kernels, so that they compute the same values bit for bit.
// Its products and sums round explicitly (the _rn intrinsics), which the
// code generator may not fuse as it may fuse a plain mul and add in one
// kernel and not in the other.
template <int V, int E>
__device__ inline void normalize(float (&v)[V][E], const float (&g)[V][E], const float (&b)[V][E],
                                 float eps, float& mean, float& rstd) {
  constexpr int C = 32 * E * V;
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i)
#pragma unroll
    for (int e = 0; e < E; ++e) s = __fadd_rn(s, v[i][e]);
  mean = __fmul_rn(warp_sum(s), 1.0f / C);
  float q = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i)
#pragma unroll
    for (int e = 0; e < E; ++e) {
      v[i][e] = __fsub_rn(v[i][e], mean);
      q = __fmaf_rn(v[i][e], v[i][e], q);
    }
  rstd = rsqrtf(__fmaf_rn(warp_sum(q), 1.0f / C, eps));
#pragma unroll
  for (int i = 0; i < V; ++i)
#pragma unroll
    for (int e = 0; e < E; ++e) v[i][e] = __fmaf_rn(__fmul_rn(v[i][e], rstd), g[i][e], b[i][e]);
}

template <int V, int E>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const bf16* __restrict__ x, const float* __restrict__ gamma,
                   const float* __restrict__ beta, int64_t rows, float eps, bf16* __restrict__ y,
                   float* __restrict__ mean_out, float* __restrict__ rstd_out) {
  constexpr int C = 32 * E * V;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * kWarps;
  float g[V][E], b[V][E];
  load_params<V, E>(gamma, lane, g);
  load_params<V, E>(beta, lane, b);
  for (int64_t r0 = (int64_t(blockIdx.x) * kWarps + threadIdx.x / 32) * kRowsPerStep; r0 < rows;
       r0 += warps * kRowsPerStep) {
    float v[kRowsPerStep][V][E];
#pragma unroll
    for (int k = 0; k < kRowsPerStep; ++k) {
      if (r0 + k < rows) load_row<V, E>(x + (r0 + k) * C, lane, v[k]);
    }
#pragma unroll
    for (int k = 0; k < kRowsPerStep; ++k) {
      if (r0 + k >= rows) break;
      float mean, rstd;
      normalize<V, E>(v[k], g, b, eps, mean, rstd);
      store_row<V, E>(y + (r0 + k) * C, lane, v[k]);
      if (lane == 0) {
        mean_out[r0 + k] = mean;
        rstd_out[r0 + k] = rstd;
      }
    }
  }
}

// forward_e4m3: a block normalises a tile of rows, each warp every
// kWarps-th row, two at a time, and stores each row's e4m3 bytes straight
// to out and to the tile in shared memory (C bytes a row, each group of 16
// rows shifted by kShift bytes); then the transposed copy: lane l takes a
// word (4 columns) of rows 16 (l % kGroups) .. + 15, turns them into the 4
// columns' 16 bytes with byte permutes and stores them, so that kGroups
// lanes store a column's tile rows as one segment (128 or 64 bytes) and
// the shifts keep the word reads free of bank conflicts.
template <int C>
struct E4m3Tile {
  static constexpr int kRows = C <= 512 ? 128 : 64;  // the tile within 66 KiB
  static constexpr int kGroups = kRows / 16;
  static constexpr int kShift = 128 / kGroups;
  static constexpr size_t kBytes = size_t(kRows) * C + kGroups * kShift;
  __device__ static int offset(int r) { return r * C + (r / 16) * kShift; }
};

template <int V, int E>
__global__ void __launch_bounds__(kThreads)
    forward_e4m3_kernel(const bf16* __restrict__ x, const float* __restrict__ gamma,
                        const float* __restrict__ beta, int64_t rows, int64_t rows_out, float eps,
                        const float* __restrict__ scale, uint8_t* __restrict__ out,
                        uint8_t* __restrict__ out_t, float* __restrict__ amax,
                        float* __restrict__ mean_out, float* __restrict__ rstd_out) {
  constexpr int C = 32 * E * V;
  using Tile = E4m3Tile<C>;
  static_assert((Tile::kRows / kWarps) % kRowsPerStep == 0, "whole steps of rows a warp");
  extern __shared__ __align__(16) uint8_t tile[];  // Tile::kBytes
  __shared__ float warp_max[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float s = scale[0];
  float g[V][E], b[V][E];
  load_params<V, E>(gamma, lane, g);
  load_params<V, E>(beta, lane, b);
  float m = 0.f;
  const int64_t tiles = (rows_out + Tile::kRows - 1) / Tile::kRows;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t row0 = t * Tile::kRows;
#pragma unroll 1
    for (int k0 = 0; k0 < Tile::kRows / kWarps; k0 += kRowsPerStep) {
      float v[kRowsPerStep][V][E];
#pragma unroll
      for (int k = 0; k < kRowsPerStep; ++k) {
        const int64_t r = row0 + (k0 + k) * kWarps + warp;
        if (r < rows) load_row<V, E>(x + r * C, lane, v[k]);
      }
#pragma unroll
      for (int k = 0; k < kRowsPerStep; ++k) {
        const int lr = (k0 + k) * kWarps + warp;
        const int64_t r = row0 + lr;
        if (r < rows) {
          float mean, rstd;
          normalize<V, E>(v[k], g, b, eps, mean, rstd);
#pragma unroll
          for (int i = 0; i < V; ++i)
#pragma unroll
            for (int e = 0; e < E; ++e) {
              // y as forward() stores it (bf16), then as the cast reads it.
              v[k][i][e] = __bfloat162float(__float2bfloat16_rn(v[k][i][e]));
              m = kernels::fp8::bounded_max(m, v[k][i][e]);
            }
          if (lane == 0) {
            mean_out[r] = mean;
            rstd_out[r] = rstd;
          }
        } else {
#pragma unroll
          for (int i = 0; i < V; ++i)
#pragma unroll
            for (int e = 0; e < E; ++e) v[k][i][e] = 0.f;  // the padding rows' bytes
        }
        if (out == nullptr) continue;
        uint8_t* trow = tile + Tile::offset(lr);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const int c = i * 32 * E + lane * E;
          if constexpr (E == 8) {
            uint2 p;
            p.x = uint32_t(kernels::fp8::pair<__NV_E4M3>(v[k][i][0], v[k][i][1], s)) |
                  (uint32_t(kernels::fp8::pair<__NV_E4M3>(v[k][i][2], v[k][i][3], s)) << 16);
            p.y = uint32_t(kernels::fp8::pair<__NV_E4M3>(v[k][i][4], v[k][i][5], s)) |
                  (uint32_t(kernels::fp8::pair<__NV_E4M3>(v[k][i][6], v[k][i][7], s)) << 16);
            if (r < rows_out) *reinterpret_cast<uint2*>(out + r * C + c) = p;
            *reinterpret_cast<uint2*>(trow + c) = p;
          } else {
            const uint16_t p = kernels::fp8::pair<__NV_E4M3>(v[k][i][0], v[k][i][1], s);
            if (r < rows_out) *reinterpret_cast<uint16_t*>(out + r * C + c) = p;
            *reinterpret_cast<uint16_t*>(trow + c) = p;
          }
        }
      }
    }
    if (out == nullptr || out_t == nullptr) continue;
    __syncthreads();
    // rows_out is a multiple of 16: a group of 16 rows is wholly in or out.
    constexpr int kWordsAWarp = 32 / Tile::kGroups;
    const int rg = lane % Tile::kGroups;
    const int64_t orow = row0 + 16 * rg;
    if (orow < rows_out) {
      for (int w = warp * kWordsAWarp + lane / Tile::kGroups; w < C / 4;
           w += kWarps * kWordsAWarp) {
        uint32_t col[4][4];  // [column][rows 4 q .. 4 q + 3]
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          uint32_t a[4], t4[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            a[i] = *reinterpret_cast<const uint32_t*>(tile + Tile::offset(16 * rg + 4 * q + i) +
                                                      4 * w);
          }
          kernels::fp8::transpose4(a, t4);
#pragma unroll
          for (int k = 0; k < 4; ++k) col[k][q] = t4[k];
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          *reinterpret_cast<uint4*>(out_t + (4 * w + k) * rows_out + orow) =
              make_uint4(col[k][0], col[k][1], col[k][2], col[k][3]);
        }
      }
    }
    __syncthreads();
  }
  kernels::fp8::block_amax<kThreads>(m, warp_max, amax);
}

// The parameter gradients are summed per lane over the warp's rows, then
// over the block's warps in shared memory, then added to global memory.
template <int V, int E>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(const bf16* __restrict__ gy, const bf16* __restrict__ x,
                    const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                    const float* __restrict__ gamma, const bf16* __restrict__ gres, int64_t rows,
                    bf16* __restrict__ gx, float* __restrict__ ggamma, float* __restrict__ gbeta,
                    float* __restrict__ gsum) {
  constexpr int C = 32 * E * V;
  __shared__ float red[kWarps][C];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t warps = int64_t(gridDim.x) * kWarps;
  float g[V][E], dg[V][E] = {}, db[V][E] = {}, ds[V][E] = {};
  load_params<V, E>(gamma, lane, g);
  for (int64_t r = int64_t(blockIdx.x) * kWarps + warp; r < rows; r += warps) {
    float xv[V][E], gv[V][E];
    load_row<V, E>(x + r * C, lane, xv);
    load_row<V, E>(gy + r * C, lane, gv);
    const float mean = mean_in[r], rstd = rstd_in[r];
    float a = 0.0f, c = 0.0f;
#pragma unroll
    for (int i = 0; i < V; ++i)
#pragma unroll
      for (int e = 0; e < E; ++e) {
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
      for (int e = 0; e < E; ++e) gv[i][e] = rstd * (gv[i][e] - a - xv[i][e] * c);
    if (gres != nullptr) {  // the residual's gradient, added before the one rounding
      load_row<V, E>(gres + r * C, lane, xv);
#pragma unroll
      for (int i = 0; i < V; ++i)
#pragma unroll
        for (int e = 0; e < E; ++e) gv[i][e] += xv[i][e];
    }
    if (gsum != nullptr) {  // the sums of gx as stored, rounded to bf16
#pragma unroll
      for (int i = 0; i < V; ++i)
#pragma unroll
        for (int e = 0; e < E; ++e) ds[i][e] += __bfloat162float(__float2bfloat16_rn(gv[i][e]));
    }
    store_row<V, E>(gx + r * C, lane, gv);
  }
#pragma unroll
  for (int pass = 0; pass < 3; ++pass) {
    if (pass == 2 && gsum == nullptr) break;
    const auto& part = pass == 0 ? dg : (pass == 1 ? db : ds);
    float* const target = pass == 0 ? ggamma : (pass == 1 ? gbeta : gsum);
#pragma unroll
    for (int i = 0; i < V; ++i)
#pragma unroll
      for (int e = 0; e < E; ++e) red[warp][i * 32 * E + lane * E + e] = part[i][e];
    __syncthreads();
    for (int col = threadIdx.x; col < C; col += kThreads) {
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += red[w][col];
      atomicAdd(target + col, s);
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

template <int V, int E>
void forward_v(const void* x, const float* gamma, const float* beta, int64_t rows, float eps,
               void* y, float* mean, float* rstd, cudaStream_t stream) {
  const unsigned grid = grid_for(forward_kernel<V, E>, rows, kRowsPerStep, 8);
  forward_kernel<V, E><<<grid, kThreads, 0, stream>>>(static_cast<const bf16*>(x), gamma, beta,
                                                      rows, eps, static_cast<bf16*>(y), mean, rstd);
  check_launch("forward");
}

template <int V, int E>
void forward_e4m3_v(const void* x, const float* gamma, const float* beta, int64_t rows,
                    int64_t rows_out, float eps, const float* scale, uint8_t* out, uint8_t* out_t,
                    float* amax, float* mean, float* rstd, cudaStream_t stream) {
  using Tile = E4m3Tile<32 * E * V>;
  constexpr size_t shared = Tile::kBytes;
  static const int per_sm = [] {
    check_cuda(cudaFuncSetAttribute(forward_e4m3_kernel<V, E>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)),
               "cudaFuncSetAttribute");
    int n = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, forward_e4m3_kernel<V, E>,
                                                             kThreads, shared),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    return n < 1 ? 1 : n;
  }();
  const int64_t tiles = (rows_out + Tile::kRows - 1) / Tile::kRows;
  const int64_t cap = int64_t(sm_count()) * per_sm;
  const auto grid = static_cast<unsigned>(tiles < cap ? (tiles > 0 ? tiles : 1) : cap);
  forward_e4m3_kernel<V, E><<<grid, kThreads, shared, stream>>>(static_cast<const bf16*>(x), gamma,
                                                                beta, rows, rows_out, eps, scale,
                                                                out, out_t, amax, mean, rstd);
  check_launch("forward_e4m3");
}

template <int V, int E>
void backward_v(const void* gy, const void* x, const float* mean, const float* rstd,
                const float* gamma, const void* gres, int64_t rows, void* gx, float* ggamma,
                float* gbeta, float* gsum, cudaStream_t stream) {
  // At most 4 blocks a multiprocessor: each ends with C atomics per parameter.
  const unsigned grid = grid_for(backward_kernel<V, E>, rows, 1, 4);
  backward_kernel<V, E><<<grid, kThreads, 0, stream>>>(
      static_cast<const bf16*>(gy), static_cast<const bf16*>(x), mean, rstd, gamma,
      static_cast<const bf16*>(gres), rows, static_cast<bf16*>(gx), ggamma, gbeta, gsum);
  check_launch("backward");
}

void check_width(int64_t width) {
  if (!supported(width)) {
    throw std::invalid_argument("layer norm kernels: unsupported width " + std::to_string(width));
  }
}

// Calls f.template run<V, E>() for the width's layout.
template <typename F>
void dispatch(int64_t width, F&& f) {
  if (width % 256 == 0) {
    switch (width / 256) {
      case 1:
        return f.template run<1, 8>();
      case 2:
        return f.template run<2, 8>();
      case 3:
        return f.template run<3, 8>();
      default:
        return f.template run<4, 8>();
    }
  }
  switch (width / 64) {  // the odd multiples of 64 below 1024
    case 1:
      return f.template run<1, 2>();
    case 2:
      return f.template run<2, 2>();
    case 3:
      return f.template run<3, 2>();
    case 5:
      return f.template run<5, 2>();
    case 6:
      return f.template run<6, 2>();
    case 7:
      return f.template run<7, 2>();
    case 9:
      return f.template run<9, 2>();
    case 10:
      return f.template run<10, 2>();
    case 11:
      return f.template run<11, 2>();
    case 13:
      return f.template run<13, 2>();
    case 14:
      return f.template run<14, 2>();
    default:
      return f.template run<15, 2>();
  }
}

struct Forward {
  const void* x;
  const float *gamma, *beta;
  int64_t rows;
  float eps;
  void* y;
  float *mean, *rstd;
  cudaStream_t s;
  template <int V, int E>
  void run() const {
    forward_v<V, E>(x, gamma, beta, rows, eps, y, mean, rstd, s);
  }
};

struct ForwardE4m3 {
  const void* x;
  const float *gamma, *beta;
  int64_t rows, rows_out;
  float eps;
  const float* scale;
  uint8_t *out, *out_t;
  float *amax, *mean, *rstd;
  cudaStream_t s;
  template <int V, int E>
  void run() const {
    forward_e4m3_v<V, E>(x, gamma, beta, rows, rows_out, eps, scale, out, out_t, amax, mean, rstd,
                         s);
  }
};

struct Backward {
  const void *gy, *x;
  const float *mean, *rstd, *gamma;
  const void* gres;
  int64_t rows;
  void* gx;
  float *ggamma, *gbeta, *gsum;
  cudaStream_t s;
  template <int V, int E>
  void run() const {
    backward_v<V, E>(gy, x, mean, rstd, gamma, gres, rows, gx, ggamma, gbeta, gsum, s);
  }
};

}  // namespace

bool supported(int64_t width) { return width > 0 && width % 64 == 0 && width <= 1024; }

void forward(const void* x, const float* gamma, const float* beta, int64_t rows, int64_t width,
             float eps, void* y, float* mean, float* rstd, void* stream) {
  check_width(width);
  if (rows == 0) return;
  dispatch(width,
           Forward{x, gamma, beta, rows, eps, y, mean, rstd, static_cast<cudaStream_t>(stream)});
}

void forward_e4m3(const void* x, const float* gamma, const float* beta, int64_t rows,
                  int64_t rows_out, int64_t width, float eps, const float* scale, uint8_t* out,
                  uint8_t* out_t, float* amax, float* mean, float* rstd, void* stream) {
  check_width(width);
  if (rows_out % 16 != 0 || rows_out < rows) {
    throw std::invalid_argument("layer norm kernels: forward_e4m3's rows_out " +
                                std::to_string(rows_out) + " is not a multiple of 16 of at least " +
                                std::to_string(rows));
  }
  if (rows_out == 0) return;
  if (out == nullptr) out_t = nullptr;
  dispatch(width, ForwardE4m3{x, gamma, beta, rows, rows_out, eps, scale, out, out_t, amax, mean,
                              rstd, static_cast<cudaStream_t>(stream)});
}

void backward(const void* gy, const void* x, const float* mean, const float* rstd,
              const float* gamma, const void* gres, int64_t rows, int64_t width, void* gx,
              float* ggamma, float* gbeta, float* gsum, void* stream) {
  check_width(width);
  if (rows == 0) return;
  dispatch(width, Backward{gy, x, mean, rstd, gamma, gres, rows, gx, ggamma, gbeta, gsum,
                           static_cast<cudaStream_t>(stream)});
}

}  // namespace slipstream::aero::layer_norm_kernels
