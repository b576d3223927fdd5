// How fast wgmma m64nNk16 (A from registers, B from shared memory) runs on
// this GPU for small N, with four warpgroups an SM as the slice kernels
// have them: each warpgroup issues batches of `kBatch` products into one
// accumulator, then waits. Prints nanoseconds and SM cycles per product
// per SM. Build and run (scripts/gpu_check.sh wgmma):
//   nvcc -std=c++17 -arch=sm_90a -I src scripts/wgmma_rate.cu -o wgmma_rate
#include "aero/kernels/common/wgmma.cuh"

#include <cuda_runtime.h>

#include <cstdio>

namespace wg = slipstream::aero::wgmma;

template <int N, int kBatch>
__global__ void __launch_bounds__(256, 2) rate(int iters, float* out) {
  __shared__ __align__(128) unsigned char smem[16 * 256 * 2];
  for (int i = threadIdx.x; i < int(sizeof(smem)); i += blockDim.x) smem[i] = 0;
  wg::shared_to_async();
  __syncthreads();
  const uint64_t desc = wg::k_major(smem, 0, 0, 16);
  const uint32_t a[4] = {threadIdx.x, 1u, 2u, 3u};
  float c[N / 8][4] = {};
  for (int it = 0; it < iters; ++it) {
    wg::fence();
#pragma unroll
    for (int b = 0; b < kBatch; ++b) wg::mma<N, 0, true>(c, a, desc);
    wg::commit_and_wait();
    wg::touch(c);
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < N / 8; ++j) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
  if (s == 1.2345f) out[threadIdx.x] = s;
}

template <int N, int kBatch>
void run(int sms, int clock_khz, float* out) {
  const int iters = 2000, blocks = 2 * sms;
  rate<N, kBatch><<<blocks, 256>>>(10, out);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  rate<N, kBatch><<<blocks, 256>>>(iters, out);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, e0, e1);
  // Products an SM: 4 warpgroups x iters x kBatch.
  const double per_sm = 4.0 * iters * kBatch;
  const double ns = ms * 1e6 / per_sm;
  const double tflops = 2.0 * 64 * N * 16 * per_sm * sms / (ms * 1e-3) / 1e12;
  std::printf(
      "m64n%-3dk16 batches of %2d: %6.2f ns (%5.1f cycles at %d MHz) a product an SM, %6.1f "
      "TFLOP/s\n",
      N, kBatch, ns, ns * clock_khz * 1e-6, clock_khz / 1000, tflops);
}

int main() {
  int sms = 0, clock_khz = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  float* out = nullptr;
  cudaMalloc(&out, 1024 * sizeof(float));
  run<16, 12>(sms, clock_khz, out);
  run<16, 1>(sms, clock_khz, out);
  run<32, 12>(sms, clock_khz, out);
  run<56, 12>(sms, clock_khz, out);
  run<56, 1>(sms, clock_khz, out);
  run<64, 12>(sms, clock_khz, out);
  run<128, 12>(sms, clock_khz, out);
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    std::printf("wgmma rate: %s\n", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}
