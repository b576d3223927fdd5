// Exact (erf) GELU and its slope on bf16 packs, for the kernels that apply
// GELU on the way (gelu_kernels.cu, and fp8_kernels.cu's casts of gelu(h)
// and of GELU's backward): ATen's formulas in fp32, bitwise ATen's results
// for every finite bf16.
//
// The input is bf16, so a block takes gelu and gelu' from a table of their
// fp32 values at every bf16 of magnitude in [2^-16, 2^5) (21 binades of
// 128, both signs: 5376 entries), which it fills in shared memory from the
// formulas; the rest (zero, tiny, large, inf, NaN: a point in ~1e5 for
// unit-scale inputs) take the formulas. The results are the formulas'
// bitwise, with a table read in place of erff and expf per element: the
// passes stay bound by memory, not arithmetic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace slipstream::aero::kernels::gelu {

constexpr float kAlpha = 0.70710678118654752440f;                                  // 1 / sqrt(2)
constexpr float kBeta = 1.12837916709551257390f * 0.70710678118654752440f * 0.5f;  // 1 / sqrt(2 pi)

union Pack8 {
  uint4 raw;
  __nv_bfloat16 v[8];
  unsigned short bits[8];
};

// The formulas (ATen's, in fp32): gelu(x) and gelu'(x) = cdf + x pdf.
__device__ inline float value_of(float x) { return x * 0.5f * (1.f + erff(x * kAlpha)); }

__device__ inline float slope_of(float x) {
  const float cdf = 0.5f * (1.f + erff(x * kAlpha));
  const float pdf = expf(-0.5f * x * x) * kBeta;
  return cdf + x * pdf;
}

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

// The block's tables (kEntries each): gelu(x) as bf16 unless `value` is
// null, gelu'(x) in fp32 unless `slope` is null. Ends with a barrier.
__device__ inline void fill_tables(__nv_bfloat16* value, float* slope) {
  for (int i = threadIdx.x; i < kEntries; i += blockDim.x) {
    const float x = entry_value(i);
    if (value != nullptr) value[i] = __float2bfloat16(value_of(x));
    if (slope != nullptr) slope[i] = slope_of(x);
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

// out = gelu(x), rounded to bf16.
__device__ __forceinline__ void forward_pack(const Pack8& x, const __nv_bfloat16* value,
                                             Pack8& out) {
  int idx[8];
  if (pack_indices(x, idx)) {
#pragma unroll
    for (int e = 0; e < 8; ++e) out.v[e] = value[idx[e]];
  } else {
    for (int e = 0; e < 8; ++e) {
      out.v[e] = idx[e] >= 0 ? value[idx[e]] : __float2bfloat16(value_of(__bfloat162float(x.v[e])));
    }
  }
}

// out_g = dy gelu'(x), rounded to bf16.
__device__ __forceinline__ void slope_pack(const Pack8& x, const Pack8& dy, const float* slope,
                                           Pack8& out_g) {
  int idx[8];
  if (pack_indices(x, idx)) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      out_g.v[e] = __float2bfloat16(__bfloat162float(dy.v[e]) * slope[idx[e]]);
    }
  } else {
    for (int e = 0; e < 8; ++e) {
      const float s = idx[e] >= 0 ? slope[idx[e]] : slope_of(__bfloat162float(x.v[e]));
      out_g.v[e] = __float2bfloat16(__bfloat162float(dy.v[e]) * s);
    }
  }
}

}  // namespace slipstream::aero::kernels::gelu
