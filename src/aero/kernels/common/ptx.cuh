// PTX wrappers the kernels share: warp reductions, mma.sync products,
// fragment loads and stores (ldmatrix, stmatrix, movmatrix) and cp.async.
// Fragment layouts: PTX ISA, "Matrix Fragments for mma.m16n8k16".
#pragma once

#include "aero/kernels/common/wgmma.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace slipstream::aero::kernels {

using bf16 = __nv_bfloat16;

__device__ inline float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ inline float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The last 8 of D when D % 16 == 8 (D = 56): an m16n8k8 product, whose A
// fragment is the first two registers of the m16n8k16 one and whose B
// fragment is its first register.
__device__ inline void mma_1688(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

// The transpose of an 8 x 8 bf16 block held one row pair per lane.
__device__ inline uint32_t transpose8(uint32_t v) {
  uint32_t t;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(t) : "r"(v));
  return t;
}

// Two bf16 (lo in the low half, as the fragments want the lower column).
__device__ inline uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ inline uint32_t load_u32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ inline void ldmatrix_x2(uint32_t (&r)[2], const bf16* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(a));
}

__device__ inline void ldmatrix_x2_trans(uint32_t (&r)[2], const bf16* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(a));
}

// stmatrix (sm_90): 8 x 8 bf16 matrices from registers in mma's fragment
// layout (lane 4 r + q: row r, columns 2 q, 2 q + 1) into shared memory,
// lanes 8 i .. 8 i + 7 naming the rows of matrix i (x4: four matrices,
// x2: two, named by lanes 0 .. 15).
__device__ inline void stmatrix_x4(const void* row, uint32_t r0, uint32_t r1, uint32_t r2,
                                   uint32_t r3) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  SLIPSTREAM_WGMMA_ASM(
      "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(r0),
      "r"(r1), "r"(r2), "r"(r3)
      : "memory");
}
__device__ inline void stmatrix_x2(const void* row, uint32_t r0, uint32_t r1) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  SLIPSTREAM_WGMMA_ASM("stmatrix.sync.aligned.m8n8.x2.shared.b16 [%0], {%1, %2};\n" ::"r"(a),
                       "r"(r0), "r"(r1)
                       : "memory");
}

// 16 bytes global -> shared, zero-filled when !valid (src is then not read).
__device__ inline void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ inline void cp_async4(void* dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
}  // namespace slipstream::aero::kernels
