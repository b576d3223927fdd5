// Probe (not built by CMake): the GeoTransolver MLP's first GEMM with GELU in
// its epilogue, on wgmma, against cuBLAS + a separate GELU pass.
//   forward  (kMode 0): h = x W1^T + b1 (bf16), a = gelu(h)      -> h, a
//   backward (kMode 1): g = bf16(dY W2) (the fc2 input gradient),
//                       dh = g gelu'(h), a = gelu(h)             -> dh, a, and
//                       column sums of dh per stream and warp (b1's gradient)
// M x N = A (M x K) B (N x K)^T, K = 448, N = 1792. It prints how many
// outputs differ from a one-thread-an-output reference by more than 1 bf16
// ulp, and the times against cuBLAS's GEMM plus a separate GELU pass.
// Measured on an H200 (2026-12-04, M 200,000; docs/benchmarks.md): cuBLAS
// 0.45-0.48 ms; this layout's main loop alone 0.97 ms (PROBE_EPI=0), the
// forward 1.72-1.74, the backward 3.97-4.01 (BK 16, 5 or 6 stages; BK 32,
// 3 stages: 1.07, 1.92, 3.44). An earlier layout (128 x 128 tiles, both operands streamed,
// two CTAs an SM) ran its main loop in 1.78 ms with L2 85 % busy. Slower
// than the library's unfused pair (~0.88 and ~1.19 ms): kept as the record
// of what was tried, not used.
// Run: bash scripts/gpu_check.sh gelugemm (GELU_GEMM_M rows, default 200000);
// -DPROBE_EPI, -DPROBE_BK, -DPROBE_STAGES pick the variants.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "aero/kernels/common/wgmma.cuh"

namespace wg = slipstream::aero::wgmma;
using bf16 = __nv_bfloat16;

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

// PROBE_EPI (a compile-time switch for the timings): 2 the epilogues as
// described, 1 only h (mode 0) or dh (mode 1) stored, 0 nothing stored but
// a value no output takes (the main loop's time alone).
#ifndef PROBE_EPI
#define PROBE_EPI 2
#endif

// The layout (the first version's 128 x 128 tiles, two CTAs an SM, ran at
// 113 TFLOP/s with its L2 84 % busy: every tile re-read its A and B rows).
// Now each CTA keeps one 224-column block of B (all of K: 196 KB) in shared
// memory and its two warpgroups stream 64-row blocks of A past it, each
// warpgroup on its own sequence of row blocks with its own three-stage
// cp.async pipeline and barrier, so that one's epilogue runs under the
// other's products. A is read once per column block (8 times), B once per
// CTA.
#ifndef PROBE_STAGES
#define PROBE_STAGES 6
#endif
#ifndef PROBE_BK
#define PROBE_BK 16
#endif
constexpr int BN = 224, BK = PROBE_BK, KD = 448, KS = KD / BK, STAGES = PROBE_STAGES, WM = 64;
static_assert(STAGES >= 3, "the loop waits for step t + 1 while step t multiplies");
constexpr int kThreads = 256;
constexpr int kBBytes = BN * KD * 2;                        // 200,704
constexpr int kAStageBytes = WM * BK * 2;                   // 4,096
constexpr int kSmem = kBBytes + 2 * STAGES * kAStageBytes;  // 225,280
static_assert(kSmem <= 232448, "more than an H200 CTA's shared memory");

namespace slipstream::aero::wgmma {
template <>
struct Wgmma<224> {
  template <int kTransB>
  __device__ static void run(float (&c)[28][4], const uint32_t (&a)[4], uint64_t desc,
                             int accumulate) {
    SLIPSTREAM_WGMMA_ASM(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %117, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n224k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, "
        "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, "
        "%55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, "
        "%73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, "
        "%91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, "
        "%107, %108, %109, %110, %111}, "
        "{%112, %113, %114, %115}, %116, p, 1, 1, %118;\n}\n"
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
          "+f"(c[15][1]), "+f"(c[15][2]), "+f"(c[15][3]), "+f"(c[16][0]), "+f"(c[16][1]),
          "+f"(c[16][2]), "+f"(c[16][3]), "+f"(c[17][0]), "+f"(c[17][1]), "+f"(c[17][2]),
          "+f"(c[17][3]), "+f"(c[18][0]), "+f"(c[18][1]), "+f"(c[18][2]), "+f"(c[18][3]),
          "+f"(c[19][0]), "+f"(c[19][1]), "+f"(c[19][2]), "+f"(c[19][3]), "+f"(c[20][0]),
          "+f"(c[20][1]), "+f"(c[20][2]), "+f"(c[20][3]), "+f"(c[21][0]), "+f"(c[21][1]),
          "+f"(c[21][2]), "+f"(c[21][3]), "+f"(c[22][0]), "+f"(c[22][1]), "+f"(c[22][2]),
          "+f"(c[22][3]), "+f"(c[23][0]), "+f"(c[23][1]), "+f"(c[23][2]), "+f"(c[23][3]),
          "+f"(c[24][0]), "+f"(c[24][1]), "+f"(c[24][2]), "+f"(c[24][3]), "+f"(c[25][0]),
          "+f"(c[25][1]), "+f"(c[25][2]), "+f"(c[25][3]), "+f"(c[26][0]), "+f"(c[26][1]),
          "+f"(c[26][2]), "+f"(c[26][3]), "+f"(c[27][0]), "+f"(c[27][1]), "+f"(c[27][2]),
          "+f"(c[27][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(kTransB));
  }
};
}  // namespace slipstream::aero::wgmma

__device__ inline float gelu_f(float x) { return 0.5f * x * (1.0f + erff(x * float(M_SQRT1_2))); }
__device__ inline float gelu_grad_f(float x) {
  const float cdf = 0.5f * (1.0f + erff(x * float(M_SQRT1_2)));
  const float pdf = expf(-0.5f * x * x) * float(M_2_SQRTPI * M_SQRT1_2 * 0.5);
  return cdf + x * pdf;
}

__device__ inline void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ inline float lo(uint32_t p) {
  return __bfloat162float(__ushort_as_bfloat16(uint16_t(p & 0xFFFF)));
}
__device__ inline float hi(uint32_t p) {
  return __bfloat162float(__ushort_as_bfloat16(uint16_t(p >> 16)));
}
__device__ inline uint32_t pick4(const uint32_t (&x)[4], int i) {
  return i == 0 ? x[0] : i == 1 ? x[1] : i == 2 ? x[2] : x[3];
}
// The quad of this lane (lanes 4 (lane / 4) + 0..3, q = lane % 4) holds a
// 4 x 4 of pairs, x[i] = this lane's pair of block i; after, y[p] = lane
// p's pair of block q. Three exchanges (lane q ^ k, k = 1, 2, 3).
__device__ inline void quad_transpose(const uint32_t (&x)[4], uint32_t (&y)[4], int q) {
#pragma unroll
  for (int i = 0; i < 4; ++i) y[i] = x[i];  // y[q] = x[q]; the others are overwritten
#pragma unroll
  for (int k = 1; k < 4; ++k) {
    const uint32_t r = __shfl_xor_sync(0xffffffffu, pick4(x, q ^ k), k);
#pragma unroll
    for (int i = 0; i < 4; ++i) y[i] = i == (q ^ k) ? r : y[i];
  }
}
// The 128 threads of warpgroup `id` wait for each other (named barrier 1 + id).
__device__ inline void warpgroup_barrier(int id) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + id) : "memory");
}
__device__ inline uint32_t pack2(bf16 lo, bf16 hi) {
  return uint32_t(__bfloat16_as_ushort(lo)) | (uint32_t(__bfloat16_as_ushort(hi)) << 16);
}

// Grid: tiles_n column blocks x `groups` CTAs each (blockIdx.x % tiles_n the
// column block). Warpgroup w of group g is stream 2 g + w of 2 groups: it
// takes row blocks stream, stream + streams, ... In kMode 1, `partial` gets
// the column sums of dh per stream and warp: [streams * 4][N].
template <int kMode>
__global__ void __launch_bounds__(kThreads, 1)
    gelu_gemm(const bf16* __restrict__ A, const bf16* __restrict__ B, const bf16* __restrict__ bias,
              const bf16* __restrict__ h_in, bf16* __restrict__ out0, bf16* __restrict__ out1,
              float* __restrict__ partial, int64_t M, int N) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int tiles_n = N / BN;
  const int n0 = (blockIdx.x % tiles_n) * BN;
  const int groups = gridDim.x / tiles_n;
  const int lane = threadIdx.x % 32, wgi = threadIdx.x / 128, wq = (threadIdx.x / 32) % 4;
  const int t128 = threadIdx.x % 128;
  const int stream = 2 * int(blockIdx.x / tiles_n) + wgi, streams = 2 * groups;
  const int64_t tiles_m = (M + WM - 1) / WM;
  const int64_t my_tiles = stream < tiles_m ? (tiles_m - 1 - stream) / streams + 1 : 0;
  const int64_t steps = my_tiles * KS;
  bf16* b_s = reinterpret_cast<bf16*>(smem);
  bf16* a_s = reinterpret_cast<bf16*>(smem + kBBytes + wgi * STAGES * kAStageBytes);

  // B's column block, all of K, by every thread: 8 lanes a core matrix.
  for (int c = threadIdx.x; c < BN * KD / 8; c += kThreads) {
    const int row = (c % 8) + 8 * (c / KD), kc = (c / 8) % (KD / 8);
    cp_async16(b_s + wg::tiled_offset(row, 8 * kc, KD), B + int64_t(n0 + row) * KD + 8 * kc, true);
  }
  cp_async_commit();
  cp_async_wait<0>();
  wg::shared_to_async();
  __syncthreads();

  const auto load_a = [&](int64_t step) {
    const int64_t m0 = (stream + (step / KS) * streams) * WM;
    const int k0 = int(step % KS) * BK;
    bf16* dst = a_s + (step % STAGES) * (kAStageBytes / 2);
#pragma unroll
    for (int i = 0; i < (WM * BK / 8) / 128; ++i) {
      const int c = t128 + 128 * i;
      const int row = (c % 8) + 8 * (c / BK), kc = (c / 8) % (BK / 8);
      const bool valid = m0 + row < M;
      cp_async16(dst + wg::tiled_offset(row, 8 * kc, BK),
                 A + (valid ? (m0 + row) * KD : 0) + k0 + 8 * kc, valid);
    }
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < steps) load_a(s);
    cp_async_commit();
  }
  float c[BN / 8][4];
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
  const int q = lane % 4, c0 = 2 * q;
  // kMode 0: b1 at this lane's accumulator columns (8 j + c0 + {0, 1}).
  // kMode 1: the column sums of dh at this lane's columns after the quad's
  // transpose: 8 (4 J + q) + e.
  float bias_f[BN / 8][2];
  float cs[BN / 32][8];
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    bias_f[j][0] = kMode == 0 ? __bfloat162float(bias[n0 + 8 * j + c0]) : 0.f;
    bias_f[j][1] = kMode == 0 ? __bfloat162float(bias[n0 + 8 * j + c0 + 1]) : 0.f;
  }
#pragma unroll
  for (int J = 0; J < BN / 32; ++J) {
#pragma unroll
    for (int e = 0; e < 8; ++e) cs[J][e] = 0.f;
  }
  const int a_row = 16 * wq + (lane % 8) + 8 * ((lane / 8) % 2);
  const int a_col = 8 * (lane / 16);
  const auto stage = [&](int64_t step) { return a_s + (step % STAGES) * (kAStageBytes / 2); };
  const auto fragments = [&](uint32_t(&af)[BK / 16][4], int64_t step) {
#pragma unroll
    for (int k = 0; k < BK / 16; ++k) {
      ldmatrix_x4(af[k], stage(step) + wg::tiled_offset(a_row, 16 * k + a_col, BK));
    }
  };
  cp_async_wait<STAGES - 2>();
  wg::shared_to_async();
  warpgroup_barrier(wgi);
  uint32_t af[2][BK / 16][4];
  if (steps > 0) fragments(af[0], 0);
    // Step t's products run while the warpgroup waits for step t + 1's
    // stage, reloads the stage step t - 1 used, and reads t + 1's A
    // fragments (double-buffered); the K steps of a row block are unrolled,
    // so that the buffers are named at compile time, and each row block ends
    // with every product finished (none in flight across the loop's edge).
#pragma unroll 1
  for (int64_t tile = 0; tile < my_tiles; ++tile) {
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const int64_t t = tile * KS + ks;
      wg::fence();
#pragma unroll
      for (int k = 0; k < BK / 16; ++k) {
        wg::mma<BN, 0, true>(c, af[ks % 2][k], wg::k_major(b_s, 0, ks * BK + 16 * k, KD));
      }
      wg::commit();
      wg::wait<1>();  // step t - 1's products: its fragments and stage are free
      cp_async_wait<STAGES - 3>();
      wg::shared_to_async();
      warpgroup_barrier(wgi);  // step t + 1 landed for all; all are past t - 1
      if (t + STAGES - 1 < steps) load_a(t + STAGES - 1);
      cp_async_commit();
      if (t + 1 < steps) fragments(af[(ks + 1) % 2], t + 1);
    }
    wg::wait<0>();
    wg::touch(c);

    // Epilogue of row block m0: rows ra and ra + 8. A quad (the 4 lanes of
    // lane / 4) holds a row's 8 columns of each 8-column block j in pairs;
    // it transposes 4 blocks at a time so that lane q holds all 8 columns of
    // block 4 J + q, and stores or loads them as 16 bytes.
    const int64_t m0 = (stream + tile * streams) * WM;
    const int64_t ra = m0 + 16 * wq + lane / 4;
    if constexpr (PROBE_EPI == 0) {
      float x = 0.f;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) x += c[j][0] + c[j][1] + c[j][2] + c[j][3];
      if (x == 1.2345e-30f) out0[threadIdx.x] = __float2bfloat16(x);
    } else {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t row = ra + 8 * r;
#pragma unroll
        for (int J = 0; J < BN / 32; ++J) {
          uint32_t x[4], y[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int j = 4 * J + i;
            x[i] = kMode == 0
                       ? pack2(__float2bfloat16(c[j][2 * r] + bias_f[j][0]),
                               __float2bfloat16(c[j][2 * r + 1] + bias_f[j][1]))
                       : pack2(__float2bfloat16(c[j][2 * r]), __float2bfloat16(c[j][2 * r + 1]));
          }
          quad_transpose(x, y, q);
          if (row >= M) continue;
          const int64_t at = row * N + n0 + 8 * (4 * J + q);
          uint4 o0, o1;
          uint32_t* p0 = &o0.x;
          uint32_t* p1 = &o1.x;
          if (kMode == 0) {
            o0 = make_uint4(y[0], y[1], y[2], y[3]);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              p1[i] = pack2(__float2bfloat16(gelu_f(lo(y[i]))), __float2bfloat16(gelu_f(hi(y[i]))));
            }
          } else {
            const uint4 hv = *reinterpret_cast<const uint4*>(h_in + at);
            const uint32_t* hp = &hv.x;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float x0 = lo(hp[i]), x1 = hi(hp[i]);
              const bf16 d0 = __float2bfloat16(lo(y[i]) * gelu_grad_f(x0));
              const bf16 d1 = __float2bfloat16(hi(y[i]) * gelu_grad_f(x1));
              cs[J][2 * i] += __bfloat162float(d0);
              cs[J][2 * i + 1] += __bfloat162float(d1);
              p0[i] = pack2(d0, d1);
              p1[i] = pack2(__float2bfloat16(gelu_f(x0)), __float2bfloat16(gelu_f(x1)));
            }
          }
          *reinterpret_cast<uint4*>(out0 + at) = o0;
          if (PROBE_EPI == 2) *reinterpret_cast<uint4*>(out1 + at) = o1;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
  }
  if constexpr (kMode == 1) {
    // This warp's column sums over its stream's rows: the 8 lanes of a
    // column (lane / 4), in a fixed order.
#pragma unroll
    for (int J = 0; J < BN / 32; ++J) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float x = cs[J][e];
        x += __shfl_xor_sync(0xffffffffu, x, 4);
        x += __shfl_xor_sync(0xffffffffu, x, 8);
        x += __shfl_xor_sync(0xffffffffu, x, 16);
        if (lane < 4) partial[int64_t(4 * stream + wq) * N + n0 + 8 * (4 * J + q) + e] = x;
      }
    }
  }
}

// The reference: one thread an output, fp32 sums in k order.
template <int kMode>
__global__ void reference(const bf16* A, const bf16* B, const bf16* bias, const bf16* h_in,
                          bf16* out0, bf16* out1, int64_t M, int N) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * N) return;
  const int64_t m = i / N;
  const int n = int(i % N);
  float acc = 0.f;
  for (int k = 0; k < KD; ++k)
    acc += __bfloat162float(A[m * KD + k]) * __bfloat162float(B[int64_t(n) * KD + k]);
  if (kMode == 0) {
    const bf16 h = __float2bfloat16(acc + __bfloat162float(bias[n]));
    out0[i] = h;
    out1[i] = __float2bfloat16(gelu_f(__bfloat162float(h)));
  } else {
    const float x = __bfloat162float(h_in[i]);
    out0[i] = __float2bfloat16(__bfloat162float(__float2bfloat16(acc)) * gelu_grad_f(x));
    out1[i] = __float2bfloat16(gelu_f(x));
  }
}

__global__ void gelu_pass(const bf16* h, bf16* a, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) a[i] = __float2bfloat16(gelu_f(__bfloat162float(h[i])));
}

// The unfused backward's GELU pass: reads h and g, writes dh over g and a.
__global__ void gelu_back_pass(const bf16* h, bf16* g, bf16* a, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = __bfloat162float(h[i]);
  g[i] = __float2bfloat16(__bfloat162float(g[i]) * gelu_grad_f(x));
  a[i] = __float2bfloat16(gelu_f(x));
}

__global__ void fill_random(bf16* p, int64_t n, uint32_t seed, float scale) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint32_t x = uint32_t(i) * 2654435761u + seed;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  p[i] = __float2bfloat16((float(x & 0xFFFFFF) / float(0x1000000) - 0.5f) * 2.f * scale);
}

// Elements whose bf16 values differ by more than `ulps` units in the last place.
int64_t mismatches(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, int ulps) {
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const int d = std::abs(int(int16_t(a[i])) - int(int16_t(b[i])));
    if (d > ulps && ((a[i] ^ b[i]) & 0x7FFF) != 0) ++bad;
  }
  return bad;
}

int main(int argc, char** argv) {
  const int64_t M = argc > 1 ? std::atoll(argv[1]) : 200000;
  const int N = 1792;
  const int64_t mn = M * N;
  bf16 *A, *B, *bias, *h, *o0, *o1, *r0, *r1;
  float* partial;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int groups = std::max(1, sms / (N / BN));  // one CTA an SM
  const int64_t partial_rows = 4 * 2 * int64_t(groups);
  CK(cudaMalloc(&A, M * KD * 2));
  CK(cudaMalloc(&B, int64_t(N) * KD * 2));
  CK(cudaMalloc(&bias, N * 2));
  CK(cudaMalloc(&h, mn * 2));
  CK(cudaMalloc(&o0, mn * 2));
  CK(cudaMalloc(&o1, mn * 2));
  CK(cudaMalloc(&r0, mn * 2));
  CK(cudaMalloc(&r1, mn * 2));
  CK(cudaMalloc(&partial, partial_rows * N * 4));
  const auto fill = [](bf16* p, int64_t n, uint32_t seed, float scale) {
    fill_random<<<unsigned((n + 255) / 256), 256>>>(p, n, seed, scale);
  };
  fill(A, M * KD, 1, 1.f);
  fill(B, int64_t(N) * KD, 2, 0.05f);
  fill(bias, N, 3, 0.5f);
  fill(h, mn, 4, 3.f);
  CK(cudaFuncSetAttribute(gelu_gemm<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  CK(cudaFuncSetAttribute(gelu_gemm<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const unsigned grid = unsigned(groups * (N / BN));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const auto time = [&](auto&& f) {
    for (int i = 0; i < 3; ++i) f();
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 20; ++i) f();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms / 20;
  };
  std::vector<uint16_t> got0(mn), got1(mn), want0(mn), want1(mn);
  for (int mode = 0; mode < 2; ++mode) {
    if (mode == 0) {
      gelu_gemm<0><<<grid, kThreads, kSmem>>>(A, B, bias, h, o0, o1, partial, M, N);
      reference<0><<<unsigned((mn + 255) / 256), 256>>>(A, B, bias, h, r0, r1, M, N);
    } else {
      gelu_gemm<1><<<grid, kThreads, kSmem>>>(A, B, bias, h, o0, o1, partial, M, N);
      reference<1><<<unsigned((mn + 255) / 256), 256>>>(A, B, bias, h, r0, r1, M, N);
    }
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got0.data(), o0, mn * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(got1.data(), o1, mn * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(want0.data(), r0, mn * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(want1.data(), r1, mn * 2, cudaMemcpyDeviceToHost));
    std::printf("mode %d: out0 %ld of %ld beyond 1 ulp (%ld beyond 0), out1 %ld beyond 1 ulp\n",
                mode, long(mismatches(got0, want0, 1)), long(mn), long(mismatches(got0, want0, 0)),
                long(mismatches(got1, want1, 1)));
    if (mode == 1) {
      // b1's gradient: the partial sums against a host sum of the reference dh.
      std::vector<float> part(partial_rows * N);
      CK(cudaMemcpy(part.data(), partial, part.size() * 4, cudaMemcpyDeviceToHost));
      double worst = 0;
      for (int n = 0; n < N; n += 97) {
        double want = 0, have = 0;
        for (int64_t m = 0; m < M; ++m) {
          uint32_t bits = uint32_t(got0[m * N + n]) << 16;
          float f;
          std::memcpy(&f, &bits, 4);
          want += f;
        }
        for (int64_t t = 0; t < partial_rows; ++t) have += part[t * N + n];
        worst = std::max(worst, std::abs(have - want) / (std::abs(want) + 1e-3));
      }
      std::printf("mode 1: column sums, worst relative error %.2e (sampled columns)\n", worst);
    }
  }
  const double flop = 2.0 * M * N * KD;
  const float t0 =
      time([&] { gelu_gemm<0><<<grid, kThreads, kSmem>>>(A, B, bias, h, o0, o1, partial, M, N); });
  const float t1 =
      time([&] { gelu_gemm<1><<<grid, kThreads, kSmem>>>(A, B, bias, h, o0, o1, partial, M, N); });
  cublasHandle_t cb;
  cublasCreate(&cb);
  const float one = 1.f, zero = 0.f;
  // cuBLAS column-major: C^T (N x M) = B (N x K as K x N^T) ... h^T = B A^T.
  const auto gemm = [&] {
    cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, N, int(M), KD, &one, B, CUDA_R_16BF, KD, A,
                 CUDA_R_16BF, KD, &zero, o0, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F,
                 CUBLAS_GEMM_DEFAULT);
  };
  const float tg = time(gemm);
  const float tp = time([&] { gelu_pass<<<unsigned((mn + 255) / 256), 256>>>(o0, o1, mn); });
  const float tb =
      time([&] { gelu_back_pass<<<unsigned((mn + 255) / 256), 256>>>(h, o0, o1, mn); });
  std::printf(
      "M %ld N %d K %d: fused forward %.3f ms (%.0f TFLOP/s), fused backward %.3f ms; "
      "cuBLAS GEMM %.3f ms (%.0f TFLOP/s), + a GELU pass %.3f ms (forward %.3f), + a GELU "
      "backward pass %.3f ms (backward %.3f)\n",
      long(M), N, KD, t0, flop / t0 / 1e9, t1, tg, flop / tg / 1e9, tp, tg + tp, tb, tg + tb);
  return 0;
}
