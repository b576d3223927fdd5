// Checks the wgmma helpers of src/aero/kernels/common/wgmma.cuh on the GPU
// (sm_90a): one warpgroup multiplies a 64 x 16 A from registers by a B from
// a tiled shared-memory matrix, K-major (n16) and MN-major (n56), and the
// results are compared with the host's. Prints the largest errors; exits 1
// when either is off. Build and run (scripts/gpu_check.sh wgmma):
//   nvcc -std=c++17 -arch=sm_90a -I src scripts/wgmma_probe.cu -o wgmma_probe
#include "aero/kernels/common/wgmma.cuh"

#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <vector>

using bf16 = __nv_bfloat16;
namespace wg = slipstream::aero::wgmma;

constexpr int kRows = 32, kCols = 64, kNarrow = 56;  // the K-major and MN-major matrices

__device__ uint32_t pack(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// a: 64 x 16 row-major; m: kRows x kCols (K-major test, cols 64) and
// kRows x kNarrow (MN-major test) row-major; out_k: 64 x 16, out_mn: 64 x 56.
__global__ void probe(const bf16* a, const bf16* mk, const bf16* mmn, float* out_k, float* out_mn) {
  __shared__ __align__(128) bf16 tk[kRows * kCols];
  __shared__ __align__(128) bf16 tmn[kRows * kNarrow];
  for (int i = threadIdx.x; i < kRows * kCols; i += blockDim.x) {
    tk[wg::tiled_offset(i / kCols, i % kCols, kCols)] = mk[i];
  }
  for (int i = threadIdx.x; i < kRows * kNarrow; i += blockDim.x) {
    tmn[wg::tiled_offset(i / kNarrow, i % kNarrow, kNarrow)] = mmn[i];
  }
  wg::shared_to_async();
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int ra = 16 * warp + lane / 4, rb = ra + 8, c0 = 2 * (lane % 4);
  const uint32_t af[4] = {pack(a + ra * 16 + c0), pack(a + rb * 16 + c0),
                          pack(a + ra * 16 + c0 + 8), pack(a + rb * 16 + c0 + 8)};
  float ck[2][4] = {}, cm[7][4] = {};
  wg::fence();
  // B[k][n] = mk[16 + n][48 + k]: n = rows 16 .. 31, k = cols 48 .. 63.
  wg::mma<16, 0, false>(ck, af, wg::k_major(tk, 16, 48, kCols));
  // B[k][n] = mmn[16 + k][n].
  wg::mma<56, 1, false>(cm, af, wg::mn_major(tmn, 16, kNarrow));
  wg::commit_and_wait();
  for (int j = 0; j < 2; ++j) {
    const int c = 8 * j + c0;
    out_k[ra * 16 + c] = ck[j][0];
    out_k[ra * 16 + c + 1] = ck[j][1];
    out_k[rb * 16 + c] = ck[j][2];
    out_k[rb * 16 + c + 1] = ck[j][3];
  }
  for (int j = 0; j < 7; ++j) {
    const int c = 8 * j + c0;
    out_mn[ra * 56 + c] = cm[j][0];
    out_mn[ra * 56 + c + 1] = cm[j][1];
    out_mn[rb * 56 + c] = cm[j][2];
    out_mn[rb * 56 + c + 1] = cm[j][3];
  }
}

int main() {
  std::vector<bf16> a(64 * 16), mk(kRows * kCols), mmn(kRows * kNarrow);
  unsigned s = 1;
  const auto rnd = [&] {
    s = s * 1664525u + 1013904223u;
    return float(int(s >> 24) - 128) / 32.0f;  // exact in bf16
  };
  for (auto& v : a) v = __float2bfloat16(rnd());
  for (auto& v : mk) v = __float2bfloat16(rnd());
  for (auto& v : mmn) v = __float2bfloat16(rnd());
  bf16 *da, *dk, *dm;
  float *ok, *om;
  cudaMalloc(&da, a.size() * 2);
  cudaMalloc(&dk, mk.size() * 2);
  cudaMalloc(&dm, mmn.size() * 2);
  cudaMalloc(&ok, 64 * 16 * 4);
  cudaMalloc(&om, 64 * 56 * 4);
  cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dk, mk.data(), mk.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dm, mmn.data(), mmn.size() * 2, cudaMemcpyHostToDevice);
  probe<<<1, 128>>>(da, dk, dm, ok, om);
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    std::printf("wgmma probe: %s\n", cudaGetErrorString(e));
    return 1;
  }
  std::vector<float> hk(64 * 16), hm(64 * 56);
  cudaMemcpy(hk.data(), ok, hk.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(hm.data(), om, hm.size() * 4, cudaMemcpyDeviceToHost);
  double ek = 0, em = 0;
  for (int r = 0; r < 64; ++r) {
    for (int n = 0; n < 16; ++n) {
      double ref = 0;
      for (int k = 0; k < 16; ++k) {
        ref += double(__bfloat162float(a[r * 16 + k])) *
               __bfloat162float(mk[(16 + n) * kCols + 48 + k]);
      }
      ek = std::fmax(ek, std::fabs(ref - hk[r * 16 + n]));
    }
    for (int n = 0; n < 56; ++n) {
      double ref = 0;
      for (int k = 0; k < 16; ++k) {
        ref +=
            double(__bfloat162float(a[r * 16 + k])) * __bfloat162float(mmn[(16 + k) * kNarrow + n]);
      }
      em = std::fmax(em, std::fabs(ref - hm[r * 56 + n]));
    }
  }
  std::printf("wgmma probe (SLIPSTREAM_WGMMA_MN_SWAP %d): K-major max error %g, MN-major %g\n",
              SLIPSTREAM_WGMMA_MN_SWAP, ek, em);
  return ek < 1e-3 && em < 1e-3 ? 0 : 1;
}
