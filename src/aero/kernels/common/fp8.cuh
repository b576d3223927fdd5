// Device helpers of the fp8 casts (fp8_kernels.h's and the LayerNorm's that
// writes fp8): saturating conversion of scaled pairs, the running max |v|
// that a non-finite value makes +inf, a block's amax in one atomic, and
// byte transposes.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace slipstream::aero::kernels::fp8 {

// (a s, b s) in kFormat, saturated to its largest finite value (NaN stays
// NaN), a's byte low.
template <__nv_fp8_interpretation_t kFormat>
__device__ __forceinline__ uint16_t pair(float a, float b, float s) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a * s, b * s), __NV_SATFINITE, kFormat);
}

// max(m, |v|), or +inf where v is not finite.
__device__ __forceinline__ float bounded_max(float m, float v) {
  return isfinite(v) ? fmaxf(m, fabsf(v)) : INFINITY;
}

// amax[0] = max(amax[0], the largest m of the block's kThreads threads):
// one atomic a block. warp_max: kThreads / 32 floats of shared memory. Every
// thread of the block must call it.
template <int kThreads>
__device__ __forceinline__ void block_amax(float m, float* warp_max, float* amax) {
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float b = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) b = fmaxf(b, warp_max[w]);
    // Non-negative floats order as their bits do.
    if (b > 0.f) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(b));
  }
}

// a: 4 rows' 32-bit words of the same 4 byte columns; col[k]: column k's
// bytes of those rows, the first row's low (for transposed copies).
__device__ __forceinline__ void transpose4(const uint32_t (&a)[4], uint32_t (&col)[4]) {
  const uint32_t t0 = __byte_perm(a[0], a[1], 0x5140), t1 = __byte_perm(a[0], a[1], 0x7362);
  const uint32_t t2 = __byte_perm(a[2], a[3], 0x5140), t3 = __byte_perm(a[2], a[3], 0x7362);
  col[0] = __byte_perm(t0, t2, 0x5410);
  col[1] = __byte_perm(t0, t2, 0x7632);
  col[2] = __byte_perm(t1, t3, 0x5410);
  col[3] = __byte_perm(t1, t3, 0x7632);
}

// Rows orow .. orow + 15 of the 4 byte columns c .. c + 3, given as the
// rows' 32-bit words (word(i): row orow + i's), stored transposed: 16
// bytes to each column's row of out_t (columns, rows_out), 16-byte aligned.
template <typename Word, typename Column>
__device__ __forceinline__ void store_columns16(const Word& word, uint8_t* out_t, int64_t rows_out,
                                                Column c, int64_t orow) {
  uint32_t col[4][4];  // [column][rows 4 q .. 4 q + 3]
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t a[4] = {word(4 * q), word(4 * q + 1), word(4 * q + 2), word(4 * q + 3)};
    uint32_t t[4];
    transpose4(a, t);
#pragma unroll
    for (int k = 0; k < 4; ++k) col[k][q] = t[k];
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    *reinterpret_cast<uint4*>(out_t + (c + k) * rows_out + orow) =
        make_uint4(col[k][0], col[k][1], col[k][2], col[k][3]);
  }
}

}  // namespace slipstream::aero::kernels::fp8
