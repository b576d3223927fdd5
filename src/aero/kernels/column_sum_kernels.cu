// See column_sum_kernels.h. Pass 1: each thread reads 8 columns (16 bytes)
// of every R-th row of its block's run, R = threads / (width / 8), with
// four loads in flight, and keeps 8 fp32 sums; the R partial sums of each
// column are added in shared memory in a fixed order. Pass 2: a thread per
// column (32 a column, then in order) adds the blocks' rows.
#include "aero/kernels/column_sum_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "aero/kernels/common/launch.h"

namespace slipstream::aero::column_sum_kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxWidth = 8 * kThreads;
constexpr int kUnroll = 4;

__global__ void __launch_bounds__(kThreads)
    partial_kernel(const __nv_bfloat16* __restrict__ m, int64_t rows, int width,
                   int64_t rows_per_block, float* __restrict__ partial) {
  extern __shared__ float sums[];  // (R, width)
  const int per_row = width / 8;
  const int stride = kThreads / per_row;  // R
  const int lane_row = threadIdx.x / per_row, col = 8 * (threadIdx.x % per_row);
  const int64_t r0 = int64_t(blockIdx.x) * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (lane_row < stride) {
    int64_t r = r0 + lane_row;
    for (; r + (kUnroll - 1) * stride < r1; r += kUnroll * stride) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        v[u] = *reinterpret_cast<const uint4*>(m + (r + int64_t(u) * stride) * width + col);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const auto* h = reinterpret_cast<const __nv_bfloat162*>(&v[u]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = __bfloat1622float2(h[e]);
          acc[2 * e] += f.x;
          acc[2 * e + 1] += f.y;
        }
      }
    }
    for (; r < r1; r += stride) {
      const uint4 v = *reinterpret_cast<const uint4*>(m + r * width + col);
      const auto* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(h[e]);
        acc[2 * e] += f.x;
        acc[2 * e + 1] += f.y;
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) sums[lane_row * width + col + e] = acc[e];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < width; c += kThreads) {
    float s = 0.f;
    for (int i = 0; i < stride; ++i) s += sums[i * width + c];
    partial[int64_t(blockIdx.x) * width + c] = s;
  }
}

// 32 columns a block; its 32 warps take every 32nd partial row, then warp 0
// adds their 32 sums in order. A block of 32 warps rather than 8: the pass
// is a few hundred dependent loads deep per column otherwise, and there are
// only width / 32 blocks.
constexpr int kFinishThreads = 1024, kFinishColumns = 32;
constexpr int kFinishGroups = kFinishThreads / kFinishColumns;

__global__ void __launch_bounds__(kFinishThreads)
    finish_kernel(const float* __restrict__ partial, int64_t blocks, int width,
                  float* __restrict__ out) {
  __shared__ float sums[kFinishGroups][kFinishColumns];
  const int lane = threadIdx.x % kFinishColumns, grp = threadIdx.x / kFinishColumns;
  const int c = blockIdx.x * kFinishColumns + lane;
  float s = 0.f;
  if (c < width) {
#pragma unroll 4
    for (int64_t b = grp; b < blocks; b += kFinishGroups) s += partial[b * width + c];
  }
  sums[grp][lane] = s;
  __syncthreads();
  if (grp == 0 && c < width) {
    float t = 0.f;
#pragma unroll
    for (int i = 0; i < kFinishGroups; ++i) t += sums[i][lane];
    out[c] = t;
  }
}

int64_t rows_per_block(int64_t rows, int64_t width) {
  const int64_t stride = kThreads / (width / 8);
  // About four blocks per multiprocessor, each at least a few sweeps long.
  const int64_t blocks = std::max<int64_t>(1, int64_t(kernels::sm_count()) * 4);
  const int64_t per = std::max<int64_t>((rows + blocks - 1) / blocks, stride * kUnroll);
  return (per + stride - 1) / stride * stride;
}

}  // namespace

bool supported(int64_t width) { return width > 0 && width % 8 == 0 && width <= kMaxWidth; }

int64_t partial_rows(int64_t rows, int64_t width) {
  if (rows <= 0) return 1;
  const int64_t per = rows_per_block(rows, width);
  return (rows + per - 1) / per;
}

void column_sum(const void* m, int64_t rows, int64_t width, float* partial, float* out,
                void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const int w = static_cast<int>(width);
  if (rows <= 0) {
    kernels::check_cuda(cudaMemsetAsync(out, 0, sizeof(float) * width, s), "cudaMemsetAsync");
    return;
  }
  const int64_t per = rows_per_block(rows, width);
  const int64_t blocks = (rows + per - 1) / per;
  const size_t smem = sizeof(float) * (kThreads / (width / 8)) * width;
  partial_kernel<<<static_cast<unsigned>(blocks), kThreads, smem, s>>>(
      static_cast<const __nv_bfloat16*>(m), rows, w, per, partial);
  kernels::check_launch("column sum", "partial");
  finish(partial, blocks, width, out, stream);
}

void finish(const float* partial, int64_t blocks, int64_t width, float* out, void* stream) {
  finish_kernel<<<static_cast<unsigned>((width + kFinishColumns - 1) / kFinishColumns),
                  kFinishThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      partial, blocks, static_cast<int>(width), out);
  kernels::check_launch("column sum", "finish");
}

}  // namespace slipstream::aero::column_sum_kernels
