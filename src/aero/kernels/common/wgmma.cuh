// Hopper's warpgroup matrix products (wgmma, sm_90a) for the slice kernels:
// four warps multiply a 64-row A, whose 16-row quarters each warp holds in
// registers as mma.sync m16n8k16 A fragments, by a B in shared memory that
// the tensor cores read once for all four (mma.sync reads it per warp). The
// accumulators come back per warp in mma.sync's C-fragment layout, 8-wide
// column tiles [j][0..3] (rows lane/4 and lane/4 + 8, columns 8 j + 2
// (lane % 4) + {0, 1}); PTX ISA, "Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate".
//
// B lives in shared memory as 8 x 8 core matrices of bf16, each 128
// contiguous bytes (8 rows of 16 bytes), no swizzle (tiled_offset below).
// One tiled (rows x cols) matrix, rows the slices and cols the head dim,
// serves both products the kernels need:
//   K-major (k = cols, n = rows): the logits x ws^T, dL/dw = gout os^T ...;
//   MN-major (k = rows, n = cols), kTransB: the weights times ws, gs, z.
//
// The instructions run only in sm_90a code (__CUDA_ARCH_FEAT_SM90_ALL); the
// callers keep an mma.sync path for other GPUs.
#pragma once

#include <cstdint>

namespace slipstream::aero::wgmma {

// Element offset of (row, col) in a tiled matrix of `cols` columns (a
// multiple of 8): core matrices row-major, 8 rows x 8 cols each.
__host__ __device__ constexpr int tiled_offset(int row, int col, int cols) {
  return ((row / 8) * (cols / 8) + col / 8) * 64 + (row % 8) * 8 + col % 8;
}

// The byte strides between neighbouring core matrices: along the columns
// 128, along the rows cols * 16.
__host__ __device__ constexpr uint32_t col_stride() { return 128; }
__host__ __device__ constexpr uint32_t row_stride(int cols) { return uint32_t(cols) * 16; }

// The instructions exist only in sm_90a code; other device passes trap
// (their callers never launch them there).
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SLIPSTREAM_WGMMA_ASM(...) __trap()
#else
#define SLIPSTREAM_WGMMA_ASM(...) asm volatile(__VA_ARGS__)
#endif

// A shared-memory matrix descriptor, no swizzle: the start address and the
// byte offsets between neighbouring core matrices along K (the leading
// dimension's) and along M or N (the stride dimension's).
__device__ inline uint64_t descriptor(const void* smem, uint32_t k_stride, uint32_t mn_stride) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return uint64_t((a & 0x3FFFF) >> 4) | (uint64_t((k_stride >> 4) & 0x3FFF) << 16) |
         (uint64_t((mn_stride >> 4) & 0x3FFF) << 32);
}

// The descriptor of the K-major B (k = cols k0 .. k0 + 15, n = rows n0 ..)
// of a tiled matrix with `cols` columns.
__device__ inline uint64_t k_major(const void* base, int n0, int k0, int cols) {
  const auto* p = static_cast<const unsigned char*>(base) + 2 * tiled_offset(n0, k0, cols);
  return descriptor(p, col_stride(), row_stride(cols));
}

// The descriptor of the MN-major B (k = rows k0 .. k0 + 15, n = all cols)
// of a tiled matrix with `cols` columns (wgmma's transposed B).
#ifndef SLIPSTREAM_WGMMA_MN_SWAP
#define SLIPSTREAM_WGMMA_MN_SWAP 0
#endif
__device__ inline uint64_t mn_major(const void* base, int k0, int cols) {
  const auto* p = static_cast<const unsigned char*>(base) + 2 * tiled_offset(k0, 0, cols);
#if SLIPSTREAM_WGMMA_MN_SWAP
  return descriptor(p, col_stride(), row_stride(cols));
#else
  return descriptor(p, row_stride(cols), col_stride());
#endif
}

// A descriptor moved on by `bytes` (a multiple of 16) in shared memory.
__device__ inline uint64_t advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// Orders the registers the next products read or write after this
// thread's other instructions (before the first wgmma of a batch).
__device__ inline void fence() { SLIPSTREAM_WGMMA_ASM("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// Ends a batch (a commit group) of products.
__device__ inline void commit() {
  SLIPSTREAM_WGMMA_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most kPending committed batches are unfinished: the
// accumulators of the others are readable after.
template <int kPending>
__device__ inline void wait() {
  SLIPSTREAM_WGMMA_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Ends a batch and waits for it: the accumulators are readable after.
__device__ inline void commit_and_wait() {
  SLIPSTREAM_WGMMA_ASM("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::
                           : "memory");
}

// Tells the compiler that c changes here, so that no read of it moves above
// this point (put it after the wait that finishes c's products): the
// accumulators of a product in flight must not be touched.
template <int R>
__device__ inline void touch(float (&c)[R][4]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(c[r][e])::"memory");
  }
}

// Shared memory written by this thread's ordinary stores, made visible to
// the tensor cores' reads (then a barrier for the other threads').
__device__ inline void shared_to_async() {
  SLIPSTREAM_WGMMA_ASM("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// One wgmma m64nNk16 (bf16 in, fp32 accumulators), A from registers.
template <int N>
struct Wgmma;

template <>
struct Wgmma<16> {
  template <int kTransB>
  __device__ static void run(float (&c)[2][4], const uint32_t (&a)[4], uint64_t desc,
                             int accumulate) {
    SLIPSTREAM_WGMMA_ASM(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, "
        "{%8, %9, %10, %11}, %12, p, 1, 1, %14;\n}\n"
        : "+f"(c[0][0]), "+f"(c[0][1]), "+f"(c[0][2]), "+f"(c[0][3]), "+f"(c[1][0]), "+f"(c[1][1]),
          "+f"(c[1][2]), "+f"(c[1][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(kTransB));
  }
};

template <>
struct Wgmma<32> {
  template <int kTransB>
  __device__ static void run(float (&c)[4][4], const uint32_t (&a)[4], uint64_t desc,
                             int accumulate) {
    SLIPSTREAM_WGMMA_ASM(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, "
        "%8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
        : "+f"(c[0][0]), "+f"(c[0][1]), "+f"(c[0][2]), "+f"(c[0][3]), "+f"(c[1][0]), "+f"(c[1][1]),
          "+f"(c[1][2]), "+f"(c[1][3]), "+f"(c[2][0]), "+f"(c[2][1]), "+f"(c[2][2]), "+f"(c[2][3]),
          "+f"(c[3][0]), "+f"(c[3][1]), "+f"(c[3][2]), "+f"(c[3][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(kTransB));
  }
};

template <>
struct Wgmma<56> {
  template <int kTransB>
  __device__ static void run(float (&c)[7][4], const uint32_t (&a)[4], uint64_t desc,
                             int accumulate) {
    SLIPSTREAM_WGMMA_ASM(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %33, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n56k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, "
        "%8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27}, "
        "{%28, %29, %30, %31}, %32, p, 1, 1, %34;\n}\n"
        : "+f"(c[0][0]), "+f"(c[0][1]), "+f"(c[0][2]), "+f"(c[0][3]), "+f"(c[1][0]), "+f"(c[1][1]),
          "+f"(c[1][2]), "+f"(c[1][3]), "+f"(c[2][0]), "+f"(c[2][1]), "+f"(c[2][2]), "+f"(c[2][3]),
          "+f"(c[3][0]), "+f"(c[3][1]), "+f"(c[3][2]), "+f"(c[3][3]), "+f"(c[4][0]), "+f"(c[4][1]),
          "+f"(c[4][2]), "+f"(c[4][3]), "+f"(c[5][0]), "+f"(c[5][1]), "+f"(c[5][2]), "+f"(c[5][3]),
          "+f"(c[6][0]), "+f"(c[6][1]), "+f"(c[6][2]), "+f"(c[6][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(kTransB));
  }
};

template <>
struct Wgmma<64> {
  template <int kTransB>
  __device__ static void run(float (&c)[8][4], const uint32_t (&a)[4], uint64_t desc,
                             int accumulate) {
    SLIPSTREAM_WGMMA_ASM(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, "
        "%8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : "+f"(c[0][0]), "+f"(c[0][1]), "+f"(c[0][2]), "+f"(c[0][3]), "+f"(c[1][0]), "+f"(c[1][1]),
          "+f"(c[1][2]), "+f"(c[1][3]), "+f"(c[2][0]), "+f"(c[2][1]), "+f"(c[2][2]), "+f"(c[2][3]),
          "+f"(c[3][0]), "+f"(c[3][1]), "+f"(c[3][2]), "+f"(c[3][3]), "+f"(c[4][0]), "+f"(c[4][1]),
          "+f"(c[4][2]), "+f"(c[4][3]), "+f"(c[5][0]), "+f"(c[5][1]), "+f"(c[5][2]), "+f"(c[5][3]),
          "+f"(c[6][0]), "+f"(c[6][1]), "+f"(c[6][2]), "+f"(c[6][3]), "+f"(c[7][0]), "+f"(c[7][1]),
          "+f"(c[7][2]), "+f"(c[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(kTransB));
  }
};

template <>
struct Wgmma<128> {
  template <int kTransB>
  __device__ static void run(float (&c)[16][4], const uint32_t (&a)[4], uint64_t desc,
                             int accumulate) {
    SLIPSTREAM_WGMMA_ASM(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, "
        "%8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, "
        "%40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, "
        "%56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : "+f"(c[0][0]), "+f"(c[0][1]), "+f"(c[0][2]), "+f"(c[0][3]), "+f"(c[1][0]), "+f"(c[1][1]),
          "+f"(c[1][2]), "+f"(c[1][3]), "+f"(c[2][0]), "+f"(c[2][1]), "+f"(c[2][2]), "+f"(c[2][3]),
          "+f"(c[3][0]), "+f"(c[3][1]), "+f"(c[3][2]), "+f"(c[3][3]), "+f"(c[4][0]), "+f"(c[4][1]),
          "+f"(c[4][2]), "+f"(c[4][3]), "+f"(c[5][0]), "+f"(c[5][1]), "+f"(c[5][2]), "+f"(c[5][3]),
          "+f"(c[6][0]), "+f"(c[6][1]), "+f"(c[6][2]), "+f"(c[6][3]), "+f"(c[7][0]), "+f"(c[7][1]),
          "+f"(c[7][2]), "+f"(c[7][3]), "+f"(c[8][0]), "+f"(c[8][1]), "+f"(c[8][2]), "+f"(c[8][3]),
          "+f"(c[9][0]), "+f"(c[9][1]), "+f"(c[9][2]), "+f"(c[9][3]), "+f"(c[10][0]),
          "+f"(c[10][1]), "+f"(c[10][2]), "+f"(c[10][3]), "+f"(c[11][0]), "+f"(c[11][1]),
          "+f"(c[11][2]), "+f"(c[11][3]), "+f"(c[12][0]), "+f"(c[12][1]), "+f"(c[12][2]),
          "+f"(c[12][3]), "+f"(c[13][0]), "+f"(c[13][1]), "+f"(c[13][2]), "+f"(c[13][3]),
          "+f"(c[14][0]), "+f"(c[14][1]), "+f"(c[14][2]), "+f"(c[14][3]), "+f"(c[15][0]),
          "+f"(c[15][1]), "+f"(c[15][2]), "+f"(c[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(kTransB));
  }
};

// c += a B (kAccumulate) or c = a B over one k step of 16, c the warp's 16
// rows x N. kTransB: B is MN-major. Both forms name c as read and written
// (the second ignores its values, scale-d 0): accumulators that are always
// "+f" stay in the same registers across loops, while a write-only first
// step made the compiler copy them between iterations, with products still
// in flight (ptxas then serializes every wgmma, C7514).
template <int N, int kTransB, bool kAccumulate>
__device__ inline void mma(float (&c)[N / 8][4], const uint32_t (&a)[4], uint64_t desc) {
  Wgmma<N>::template run<kTransB>(c, a, desc, kAccumulate ? 1 : 0);
}

}  // namespace slipstream::aero::wgmma
