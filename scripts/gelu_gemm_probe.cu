// Probe (not built by CMake): the GeoTransolver MLP's first GEMM with GELU in
// its epilogue, on wgmma, against cuBLAS + a separate GELU pass.
//   forward  (kMode 0): h = x W1^T + b1 (bf16), a = gelu(h)      -> h, a
//   backward (kMode 1): g = bf16(dY W2) (the fc2 input gradient),
//                       dh = g gelu'(h), a = gelu(h)             -> dh, a, and
//                       per-CTA column sums of dh (b1's gradient)
// M x N = A (M x K) B (N x K)^T, K = 448, N a multiple of 128; 128 x 128
// tiles, two warpgroups of wgmma m64n128k16 (A from registers through
// ldmatrix, B from shared memory), a three-stage cp.async pipeline, two
// CTAs an SM. It prints how many outputs differ from a one-thread-an-output
// reference by more than 1 bf16 ulp, and the times against cuBLAS's GEMM
// plus a separate GELU pass. Written on 2026-12-04 on a machine without a
// GPU (it compiles there: 126 and 128 registers, no spills) and not yet
// run: a question for the next device session, not a result.
// Run: bash scripts/gpu_check.sh gelugemm (GELU_GEMM_M rows, default 200000).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "aero/model/kernels/wgmma.cuh"

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

constexpr int BM = 128, BN = 128, BK = 64, KD = 448, KT = KD / BK, STAGES = 3;
constexpr int kThreads = 256;                   // two warpgroups, 64 rows each
constexpr int kTileBytes = BM * BK * 2;         // one operand's stage (A and B alike)
constexpr int kSmem = STAGES * 2 * kTileBytes;  // 96 KB: two CTAs an SM

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
__device__ inline uint32_t pack2(bf16 lo, bf16 hi) {
  return uint32_t(__bfloat16_as_ushort(lo)) | (uint32_t(__bfloat16_as_ushort(hi)) << 16);
}

// One stage: rows r0 .. r0 + 127 of a (rows x KD) row-major matrix, columns
// k0 .. k0 + 63, into the tiled layout (wgmma.cuh: 8 x 8 core matrices,
// 64 columns). Lanes take 8 rows at one 16-byte column piece, so that the
// eight pieces land in one 128-byte core matrix (no bank conflict) and a
// warp reads 64 contiguous bytes of each of its 8 rows.
__device__ inline void load_stage(bf16* dst, const bf16* src, int64_t r0, int64_t rows, int k0) {
#pragma unroll
  for (int i = 0; i < (BM * BK / 8) / kThreads; ++i) {
    const int c = threadIdx.x + kThreads * i;
    const int row = (c % 8) + 8 * (c / 64), kc = (c / 8) % 8;
    const bool valid = r0 + row < rows;
    const bf16* s = src + (valid ? (r0 + row) * KD : 0) + k0 + 8 * kc;
    cp_async16(dst + wg::tiled_offset(row, 8 * kc, BK), s, valid);
  }
}

template <int kMode>
__global__ void __launch_bounds__(kThreads, 2)
    gelu_gemm(const bf16* __restrict__ A, const bf16* __restrict__ B, const bf16* __restrict__ bias,
              const bf16* __restrict__ h_in, bf16* __restrict__ out0, bf16* __restrict__ out1,
              float* __restrict__ partial, int64_t M, int N) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int tiles_n = N / BN;
  const int64_t tm = blockIdx.x / tiles_n;
  const int tn = blockIdx.x % tiles_n;  // N fastest: a row block's tiles run together (A in L2)
  const int64_t m0 = tm * BM;
  const int n0 = tn * BN;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wgi = warp / 4, wq = warp % 4;
  const auto a_stage = [&](int s) { return reinterpret_cast<bf16*>(smem + s * 2 * kTileBytes); };
  const auto b_stage = [&](int s) {
    return reinterpret_cast<bf16*>(smem + s * 2 * kTileBytes + kTileBytes);
  };
  const auto load = [&](int kt) {
    const int s = kt % STAGES;
    load_stage(a_stage(s), A, m0, M, kt * BK);
    load_stage(b_stage(s), B, n0, N, kt * BK);
  };
#pragma unroll
  for (int kt = 0; kt < STAGES - 1; ++kt) {
    load(kt);
    cp_async_commit();
  }
  float c[BN / 8][4];
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
  // This warp's 16 rows of the A tile; lane l gives row l % 8 (+ 8 for
  // matrices 1 and 3) at column piece l / 16 of a 16-column step.
  const int a_row = 64 * wgi + 16 * wq + (lane % 8) + 8 * ((lane / 8) % 2);
  const int a_col = 8 * (lane / 16);
#pragma unroll 1
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();
    wg::shared_to_async();
    __syncthreads();  // stage kt landed everywhere; every warpgroup is done with kt - 1
    if (kt + STAGES - 1 < KT) load(kt + STAGES - 1);
    cp_async_commit();  // (an empty group past the end keeps the count)
    const int s = kt % STAGES;
    uint32_t af[BK / 16][4];
#pragma unroll
    for (int k = 0; k < BK / 16; ++k) {
      ldmatrix_x4(af[k], a_stage(s) + wg::tiled_offset(a_row, 16 * k + a_col, BK));
    }
    wg::touch(c);
    wg::fence();
#pragma unroll
    for (int k = 0; k < BK / 16; ++k) {
      wg::mma<BN, 0, true>(c, af[k], wg::k_major(b_stage(s), 0, 16 * k, BK));
    }
    wg::commit_and_wait();
    wg::touch(c);
  }

  // Epilogue: rows ra, rb = ra + 8 of this warp; columns n0 + 8 j + c0 + {0, 1}.
  const int64_t ra = m0 + 64 * wgi + 16 * wq + lane / 4, rb = ra + 8;
  const int c0 = 2 * (lane % 4);
  float cs[BN / 8][2];  // kMode 1: this lane's column sums of dh over rows ra, rb
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int col = n0 + 8 * j + c0;
    float v[4];
    if (kMode == 0) {
      const float b0 = __bfloat162float(bias[col]), b1 = __bfloat162float(bias[col + 1]);
      const bf16 h0 = __float2bfloat16(c[j][0] + b0), h1 = __float2bfloat16(c[j][1] + b1);
      const bf16 h2 = __float2bfloat16(c[j][2] + b0), h3 = __float2bfloat16(c[j][3] + b1);
      if (ra < M) {
        *reinterpret_cast<uint32_t*>(out0 + ra * N + col) = pack2(h0, h1);
        *reinterpret_cast<uint32_t*>(out1 + ra * N + col) =
            pack2(__float2bfloat16(gelu_f(__bfloat162float(h0))),
                  __float2bfloat16(gelu_f(__bfloat162float(h1))));
      }
      if (rb < M) {
        *reinterpret_cast<uint32_t*>(out0 + rb * N + col) = pack2(h2, h3);
        *reinterpret_cast<uint32_t*>(out1 + rb * N + col) =
            pack2(__float2bfloat16(gelu_f(__bfloat162float(h2))),
                  __float2bfloat16(gelu_f(__bfloat162float(h3))));
      }
      (void)v;
    } else {
      cs[j][0] = cs[j][1] = 0.f;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t row = r == 0 ? ra : rb;
        if (row >= M) continue;
        const uint32_t hp = *reinterpret_cast<const uint32_t*>(h_in + row * N + col);
        const float x0 = __bfloat162float(__ushort_as_bfloat16(uint16_t(hp & 0xFFFF)));
        const float x1 = __bfloat162float(__ushort_as_bfloat16(uint16_t(hp >> 16)));
        // The GEMM's output as the unfused path stores it (bf16), then
        // gelu_backward in fp32.
        const float g0 = __bfloat162float(__float2bfloat16(c[j][2 * r]));
        const float g1 = __bfloat162float(__float2bfloat16(c[j][2 * r + 1]));
        const bf16 d0 = __float2bfloat16(g0 * gelu_grad_f(x0));
        const bf16 d1 = __float2bfloat16(g1 * gelu_grad_f(x1));
        cs[j][0] += __bfloat162float(d0);
        cs[j][1] += __bfloat162float(d1);
        *reinterpret_cast<uint32_t*>(out0 + row * N + col) = pack2(d0, d1);
        *reinterpret_cast<uint32_t*>(out1 + row * N + col) =
            pack2(__float2bfloat16(gelu_f(x0)), __float2bfloat16(gelu_f(x1)));
      }
    }
  }
  if constexpr (kMode == 1) {
    // The column sums over this CTA's 128 rows: the 8 lanes of a column
    // (lane / 4), then the 8 warps through shared memory (the stages are
    // free now), in a fixed order.
    __syncthreads();
    float* sums = reinterpret_cast<float*>(smem);  // [8 warps][BN]
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float t = cs[j][e];
        t += __shfl_xor_sync(0xffffffffu, t, 4);
        t += __shfl_xor_sync(0xffffffffu, t, 8);
        t += __shfl_xor_sync(0xffffffffu, t, 16);
        if (lane < 4) sums[warp * BN + 8 * j + c0 + e] = t;
      }
    }
    __syncthreads();
    if (threadIdx.x < BN) {
      float t = 0.f;
      for (int w = 0; w < kThreads / 32; ++w) t += sums[w * BN + threadIdx.x];
      partial[tm * N + n0 + threadIdx.x] = t;
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
  const int64_t tiles_m = (M + BM - 1) / BM;
  CK(cudaMalloc(&A, M * KD * 2));
  CK(cudaMalloc(&B, int64_t(N) * KD * 2));
  CK(cudaMalloc(&bias, N * 2));
  CK(cudaMalloc(&h, mn * 2));
  CK(cudaMalloc(&o0, mn * 2));
  CK(cudaMalloc(&o1, mn * 2));
  CK(cudaMalloc(&r0, mn * 2));
  CK(cudaMalloc(&r1, mn * 2));
  CK(cudaMalloc(&partial, tiles_m * N * 4));
  const auto fill = [](bf16* p, int64_t n, uint32_t seed, float scale) {
    fill_random<<<unsigned((n + 255) / 256), 256>>>(p, n, seed, scale);
  };
  fill(A, M * KD, 1, 1.f);
  fill(B, int64_t(N) * KD, 2, 0.05f);
  fill(bias, N, 3, 0.5f);
  fill(h, mn, 4, 3.f);
  CK(cudaFuncSetAttribute(gelu_gemm<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  CK(cudaFuncSetAttribute(gelu_gemm<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const unsigned grid = unsigned(tiles_m * (N / BN));
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
      std::vector<float> part(tiles_m * N);
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
        for (int64_t t = 0; t < tiles_m; ++t) have += part[t * N + n];
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
