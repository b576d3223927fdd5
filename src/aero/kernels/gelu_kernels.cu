#include "aero/kernels/gelu_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "aero/kernels/column_sum_kernels.h"
#include "aero/kernels/common/launch.h"

namespace slipstream::aero::gelu_kernels {
namespace {

constexpr int kThreads = 256;
constexpr float kAlpha = 0.70710678118654752440f;                                  // 1 / sqrt(2)
constexpr float kBeta = 1.12837916709551257390f * 0.70710678118654752440f * 0.5f;  // 1 / sqrt(2 pi)

union Pack8 {
  uint4 raw;
  __nv_bfloat16 v[8];
  unsigned short bits[8];
};

// The formulas (ATen's, in fp32): gelu(x) and gelu'(x) = cdf + x pdf.
__device__ inline float gelu(float x) { return x * 0.5f * (1.f + erff(x * kAlpha)); }

__device__ inline float gelu_slope(float x) {
  const float cdf = 0.5f * (1.f + erff(x * kAlpha));
  const float pdf = expf(-0.5f * x * x) * kBeta;
  return cdf + x * pdf;
}

// The input is bf16, so each kernel takes gelu and gelu' from a table of
// their fp32 values at every bf16 of magnitude in [2^-16, 2^5) (21
// binades of 128, both signs: 5376 entries), which each block fills in
// shared memory from the formulas above; the rest (zero, tiny, large, inf,
// NaN: a point in ~1e5 for unit-scale inputs) take the formulas. The
// results are the formulas' bitwise, with a table read in place of erff
// and expf per element: the passes stay bound by memory, not arithmetic.
constexpr unsigned kLoBits = (127u - 16u) << 7;  // bits of 2^-16
constexpr int kHalf = 21 * 128;                  // entries of one sign
constexpr int kEntries = 2 * kHalf;

// The entry of a bf16's bits, or -1 outside the table.
__device__ inline int table_index(unsigned bits) {
  const unsigned off = (bits & 0x7fffu) - kLoBits;  // wraps below the table
  return off < unsigned(kHalf) ? static_cast<int>(off + (bits >> 15) * kHalf) : -1;
}

__device__ inline float entry_value(int i) {
  const unsigned bits = (i >= kHalf ? 0x8000u : 0u) | (kLoBits + unsigned(i % kHalf));
  return __uint_as_float(bits << 16);
}

// The block's tables: gelu(x) as bf16 and, when slope is not null, gelu'(x)
// in fp32. Ends with a barrier.
__device__ inline void fill_tables(__nv_bfloat16* value, float* slope) {
  for (int i = threadIdx.x; i < kEntries; i += kThreads) {
    const float x = entry_value(i);
    value[i] = __float2bfloat16(gelu(x));
    if (slope != nullptr) slope[i] = gelu_slope(x);
  }
  __syncthreads();
}

// The entries of a pack's 8 elements; false when one is outside the table.
__device__ inline bool pack_indices(const Pack8& x, int (&idx)[8]) {
  bool all = true;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    idx[e] = table_index(x.bits[e]);
    all = all && idx[e] >= 0;
  }
  return all;
}

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
      const float s = idx[e] >= 0 ? slope[idx[e]] : gelu_slope(xv);
      out_g.v[e] = __float2bfloat16(__bfloat162float(dy.v[e]) * s);
      out_a.v[e] = idx[e] >= 0 ? value[idx[e]] : __float2bfloat16(gelu(xv));
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
    int idx[8];
    if (pack_indices(x, idx)) {
#pragma unroll
      for (int e = 0; e < 8; ++e) out.v[e] = value[idx[e]];
    } else {
      for (int e = 0; e < 8; ++e) {
        out.v[e] = idx[e] >= 0 ? value[idx[e]] : __float2bfloat16(gelu(__bfloat162float(x.v[e])));
      }
    }
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
