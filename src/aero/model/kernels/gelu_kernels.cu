#include "aero/model/kernels/gelu_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "aero/model/kernels/column_sum_kernels.h"
#include "aero/model/kernels/launch.h"

namespace slipstream::aero::gelu_kernels {
namespace {

constexpr int kThreads = 256;
constexpr float kAlpha = 0.70710678118654752440f;                                  // 1 / sqrt(2)
constexpr float kBeta = 1.12837916709551257390f * 0.70710678118654752440f * 0.5f;  // 1 / sqrt(2 pi)

union Pack8 {
  uint4 raw;
  __nv_bfloat16 v[8];
};

__device__ inline float gelu(float x) { return x * 0.5f * (1.f + erff(x * kAlpha)); }

__global__ void __launch_bounds__(kThreads)
    forward_kernel(const uint4* __restrict__ h, uint4* __restrict__ a, int64_t packs) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < packs;
       i += int64_t(gridDim.x) * kThreads) {
    Pack8 x, out;
    x.raw = h[i];
#pragma unroll
    for (int e = 0; e < 8; ++e) out.v[e] = __float2bfloat16(gelu(__bfloat162float(x.v[e])));
    a[i] = out.raw;
  }
}

__global__ void __launch_bounds__(kThreads)
    backward_and_forward_kernel(const uint4* __restrict__ h, uint4* __restrict__ g,
                                uint4* __restrict__ a, int64_t packs) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < packs;
       i += int64_t(gridDim.x) * kThreads) {
    Pack8 x, dy, out_g, out_a;
    x.raw = h[i];
    dy.raw = g[i];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float xv = __bfloat162float(x.v[e]);
      const float cdf = 0.5f * (1.f + erff(xv * kAlpha));
      const float pdf = expf(-0.5f * xv * xv) * kBeta;
      out_g.v[e] = __float2bfloat16(__bfloat162float(dy.v[e]) * (cdf + xv * pdf));
      out_a.v[e] = __float2bfloat16(gelu(xv));
    }
    g[i] = out_g.raw;
    a[i] = out_a.raw;
  }
}

// The same on a (rows, width) matrix, with the column sums of the new g:
// as column_sum_kernels' first pass, each thread owns 8 columns of every
// R-th row of its block's run (R = threads / (width / 8)) and keeps their
// sums; the R sums of a column are added in shared memory in a fixed order
// and written as the block's row of `partial`.
__global__ void __launch_bounds__(kThreads)
    backward_and_forward_sums_kernel(const uint4* __restrict__ h, uint4* __restrict__ g,
                                     uint4* __restrict__ a, int64_t rows, int per_row,
                                     int64_t rows_per_block, float* __restrict__ partial) {
  extern __shared__ float sums[];  // (R, width)
  const int width = 8 * per_row, stride = kThreads / per_row;
  const int lane_row = threadIdx.x / per_row, col = threadIdx.x % per_row;
  const int64_t r0 = int64_t(blockIdx.x) * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (lane_row < stride) {
#pragma unroll 4
    for (int64_t r = r0 + lane_row; r < r1; r += stride) {
      const int64_t i = r * per_row + col;
      Pack8 x, dy, out_g, out_a;
      x.raw = h[i];
      dy.raw = g[i];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float xv = __bfloat162float(x.v[e]);
        const float cdf = 0.5f * (1.f + erff(xv * kAlpha));
        const float pdf = expf(-0.5f * xv * xv) * kBeta;
        out_g.v[e] = __float2bfloat16(__bfloat162float(dy.v[e]) * (cdf + xv * pdf));
        out_a.v[e] = __float2bfloat16(gelu(xv));
        acc[e] += __bfloat162float(out_g.v[e]);
      }
      g[i] = out_g.raw;
      a[i] = out_a.raw;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) sums[lane_row * width + 8 * col + e] = acc[e];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < width; c += kThreads) {
    float t = 0.f;
    for (int i = 0; i < stride; ++i) t += sums[i * width + c];
    partial[int64_t(blockIdx.x) * width + c] = t;
  }
}

// Rows a block of the sums kernel takes: about four blocks an SM, a
// multiple of R.
int64_t sums_rows_per_block(int64_t rows, int64_t width) {
  const int64_t stride = kThreads / (width / 8);
  const int64_t blocks = std::max<int64_t>(1, int64_t(kernels::sm_count()) * 4);
  const int64_t per = std::max<int64_t>((rows + blocks - 1) / blocks, stride);
  return (per + stride - 1) / stride * stride;
}

}  // namespace

bool supported(const void* h, const void* g, const void* a, int64_t n) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return n % 8 == 0 && aligned(h) && aligned(g) && aligned(a);
}

// A grid-stride launch over `packs` 8-element pieces: at most 32 blocks an SM.
unsigned blocks_for(int64_t packs) {
  const int64_t wanted = (packs + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<int64_t>(wanted, int64_t{32} * kernels::sm_count()));
}

void backward_and_forward(const void* h, void* g, void* a, int64_t n, void* stream) {
  const int64_t packs = n / 8;
  if (packs == 0) return;
  backward_and_forward_kernel<<<blocks_for(packs), kThreads, 0,
                                static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(h), static_cast<uint4*>(g), static_cast<uint4*>(a), packs);
  kernels::check_launch("gelu", "backward_and_forward_kernel");
}

bool sums_supported(const void* h, const void* g, const void* a, int64_t width) {
  return width > 0 && width % 8 == 0 && width <= 8 * kThreads && supported(h, g, a, width);
}

int64_t sums_partial_rows(int64_t rows, int64_t width) {
  if (rows <= 0) return 1;
  const int64_t per = sums_rows_per_block(rows, width);
  return (rows + per - 1) / per;
}

void backward_and_forward_sums(const void* h, void* g, void* a, int64_t rows, int64_t width,
                               float* partial, float* colsum, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (rows <= 0) {
    kernels::check_cuda(cudaMemsetAsync(colsum, 0, sizeof(float) * width, s), "cudaMemsetAsync");
    return;
  }
  const int per_row = static_cast<int>(width / 8);
  const int64_t per = sums_rows_per_block(rows, width);
  const int64_t blocks = (rows + per - 1) / per;
  const size_t smem = sizeof(float) * (kThreads / per_row) * width;
  backward_and_forward_sums_kernel<<<static_cast<unsigned>(blocks), kThreads, smem, s>>>(
      static_cast<const uint4*>(h), static_cast<uint4*>(g), static_cast<uint4*>(a), rows, per_row,
      per, partial);
  kernels::check_launch("gelu", "backward_and_forward_sums_kernel");
  column_sum_kernels::finish(partial, blocks, width, colsum, stream);
}

void forward(const void* h, void* a, int64_t n, void* stream) {
  const int64_t packs = n / 8;
  if (packs == 0) return;
  forward_kernel<<<blocks_for(packs), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(h), static_cast<uint4*>(a), packs);
  kernels::check_launch("gelu", "forward_kernel");
}

}  // namespace slipstream::aero::gelu_kernels
