#include "aero/kernels/gelu_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "aero/kernels/column_sum_kernels.h"
#include "aero/kernels/common/gelu.cuh"
#include "aero/kernels/common/launch.h"

namespace slipstream::aero::gelu_kernels {
namespace {

constexpr int kThreads = 256;

namespace gelu = kernels::gelu;
using gelu::fill_tables;
using gelu::kEntries;
using gelu::Pack8;
using gelu::pack_indices;

// One pack's backward: out_g = dy gelu'(x) and out_a = gelu(x), rounded to
// bf16.
__device__ __forceinline__ void backward_pack(const Pack8& x, const Pack8& dy,
                                              const __nv_bfloat16* value, const float* slope,
                                              Pack8& out_g, Pack8& out_a) {
  int idx[8];
  if (pack_indices(x, idx)) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      out_g.v[e] = __float2bfloat16(__bfloat162float(dy.v[e]) * slope[idx[e]]);
      out_a.v[e] = value[idx[e]];
    }
  } else {
    for (int e = 0; e < 8; ++e) {
      const float xv = __bfloat162float(x.v[e]);
      const float s = idx[e] >= 0 ? slope[idx[e]] : gelu::slope_of(xv);
      out_g.v[e] = __float2bfloat16(__bfloat162float(dy.v[e]) * s);
      out_a.v[e] = idx[e] >= 0 ? value[idx[e]] : __float2bfloat16(gelu::value_of(xv));
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    forward_kernel(const uint4* __restrict__ h, uint4* __restrict__ a, int64_t packs) {
  __shared__ __nv_bfloat16 value[kEntries];
  fill_tables(value, nullptr);
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < packs;
       i += int64_t(gridDim.x) * kThreads) {
    Pack8 x, out;
    x.raw = h[i];
    gelu::forward_pack(x, value, out);
    a[i] = out.raw;
  }
}

__global__ void __launch_bounds__(kThreads)
    backward_and_forward_kernel(const uint4* __restrict__ h, uint4* __restrict__ g,
                                uint4* __restrict__ a, int64_t packs) {
  __shared__ __nv_bfloat16 value[kEntries];
  __shared__ float slope[kEntries];
  fill_tables(value, slope);
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < packs;
       i += int64_t(gridDim.x) * kThreads) {
    Pack8 x, dy, out_g, out_a;
    x.raw = h[i];
    dy.raw = g[i];
    backward_pack(x, dy, value, slope, out_g, out_a);
    g[i] = out_g.raw;
    a[i] = out_a.raw;
  }
}

// The same on a (rows, width) matrix, with the column sums of the new g:
// the same grid-stride walk over 8-element packs as backward_and_forward,
// with a stride (blocks x threads) that is a multiple of the packs in a
// row, so that each thread keeps to one 8-column piece and sums it in
// registers; then a block adds its threads' sums of each column in thread
// order (shared memory) and writes them as its row of `partial`.
__global__ void __launch_bounds__(kThreads, 5)
    backward_and_forward_sums_kernel(const uint4* __restrict__ h, uint4* __restrict__ g,
                                     uint4* __restrict__ a, int64_t packs, int per_row,
                                     float* __restrict__ partial) {
  __shared__ float sums[kThreads][8];
  __shared__ __nv_bfloat16 value[kEntries];
  __shared__ float slope[kEntries];
  fill_tables(value, slope);
  const int64_t first = int64_t(blockIdx.x) * kThreads;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int64_t i = first + threadIdx.x; i < packs; i += int64_t(gridDim.x) * kThreads) {
    Pack8 x, dy, out_g, out_a;
    x.raw = h[i];
    dy.raw = g[i];
    backward_pack(x, dy, value, slope, out_g, out_a);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] += __bfloat162float(out_g.v[e]);
    g[i] = out_g.raw;
    if (a != nullptr) a[i] = out_a.raw;
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) sums[threadIdx.x][e] = acc[e];
  __syncthreads();
  // Thread t of the block sums the 8 columns of piece (first + t) % per_row.
  const int base = static_cast<int>(first % per_row), width = 8 * per_row;
  for (int c = threadIdx.x; c < width; c += kThreads) {
    float t = 0.f;
    for (int k = (c / 8 - base + per_row) % per_row; k < kThreads; k += per_row)
      t += sums[k][c % 8];
    partial[int64_t(blockIdx.x) * width + c] = t;
  }
}

// Blocks of the sums kernel: one wave (as many as are resident at once, so
// that every block does the same number of sweeps at the same time),
// rounded down to a multiple of per_row / gcd(threads, per_row), at least
// that.
int64_t sums_blocks(int64_t width) {
  const int64_t per_row = width / 8;
  int64_t x = kThreads, y = per_row;
  while (y != 0) {
    const int64_t r = x % y;
    x = y;
    y = r;
  }
  const int64_t step = per_row / x;
  static const int per_sm = [] {
    int n = 0;
    kernels::check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                            &n, backward_and_forward_sums_kernel, kThreads, 0),
                        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    return std::max(n, 1);
  }();
  const int64_t want = int64_t(kernels::sm_count()) * per_sm;
  return std::max<int64_t>(step, want / step * step);
}

}  // namespace

bool supported(const void* h, const void* g, const void* a, int64_t n) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return n % 8 == 0 && aligned(h) && aligned(g) && aligned(a);
}

// A grid-stride launch of `kernel` over `packs` 8-element pieces: at most
// one wave (the blocks resident at once), since each block first fills its
// tables.
template <auto* Kernel>
unsigned blocks_for(int64_t packs) {
  static const int per_sm = [] {
    int n = 0;
    kernels::check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, Kernel, kThreads, 0),
                        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    return std::max(n, 1);
  }();
  const int64_t wave = int64_t(kernels::sm_count()) * per_sm;
  return static_cast<unsigned>(std::min<int64_t>((packs + kThreads - 1) / kThreads, wave));
}

void backward_and_forward(const void* h, void* g, void* a, int64_t n, void* stream) {
  const int64_t packs = n / 8;
  if (packs == 0) return;
  backward_and_forward_kernel<<<blocks_for<backward_and_forward_kernel>(packs), kThreads, 0,
                                static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(h), static_cast<uint4*>(g), static_cast<uint4*>(a), packs);
  kernels::check_launch("gelu", "backward_and_forward_kernel");
}

bool sums_supported(const void* h, const void* g, const void* a, int64_t width) {
  return width > 0 && width % 8 == 0 && width <= 8 * kThreads && supported(h, g, a, width);
}

int64_t sums_partial_rows(int64_t rows, int64_t width) {
  (void)rows;
  return sums_blocks(width);
}

void backward_and_forward_sums(const void* h, void* g, void* a, int64_t rows, int64_t width,
                               float* partial, float* colsum, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t blocks = sums_blocks(width);
  backward_and_forward_sums_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
      static_cast<const uint4*>(h), static_cast<uint4*>(g), static_cast<uint4*>(a),
      rows * (width / 8), static_cast<int>(width / 8), partial);
  kernels::check_launch("gelu", "backward_and_forward_sums_kernel");
  column_sum_kernels::finish(partial, blocks, width, colsum, stream);
}

void forward(const void* h, void* a, int64_t n, void* stream) {
  const int64_t packs = n / 8;
  if (packs == 0) return;
  forward_kernel<<<blocks_for<forward_kernel>(packs), kThreads, 0,
                   static_cast<cudaStream_t>(stream)>>>(static_cast<const uint4*>(h),
                                                        static_cast<uint4*>(a), packs);
  kernels::check_launch("gelu", "forward_kernel");
}

}  // namespace slipstream::aero::gelu_kernels
