#include "aero/model/kernels/gelu_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "aero/model/kernels/launch.h"

namespace slipstream::aero::gelu_kernels {
namespace {

constexpr int kThreads = 256;
constexpr float kAlpha = 0.70710678118654752440f;                                  // 1 / sqrt(2)
constexpr float kBeta = 1.12837916709551257390f * 0.70710678118654752440f * 0.5f;  // 1 / sqrt(2 pi)

union Pack8 {
  uint4 raw;
  __nv_bfloat16 v[8];
};

__device__ inline float gelu(float x) { return x * 0.5f * (1.f + erff(x * kAlpha)); }

__global__ void __launch_bounds__(kThreads)
    forward_kernel(const uint4* __restrict__ h, uint4* __restrict__ a, int64_t packs) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < packs;
       i += int64_t(gridDim.x) * kThreads) {
    Pack8 x, out;
    x.raw = h[i];
#pragma unroll
    for (int e = 0; e < 8; ++e) out.v[e] = __float2bfloat16(gelu(__bfloat162float(x.v[e])));
    a[i] = out.raw;
  }
}

__global__ void __launch_bounds__(kThreads)
    backward_and_forward_kernel(const uint4* __restrict__ h, uint4* __restrict__ g,
                                uint4* __restrict__ a, int64_t packs) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < packs;
       i += int64_t(gridDim.x) * kThreads) {
    Pack8 x, dy, out_g, out_a;
    x.raw = h[i];
    dy.raw = g[i];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float xv = __bfloat162float(x.v[e]);
      const float cdf = 0.5f * (1.f + erff(xv * kAlpha));
      const float pdf = expf(-0.5f * xv * xv) * kBeta;
      out_g.v[e] = __float2bfloat16(__bfloat162float(dy.v[e]) * (cdf + xv * pdf));
      out_a.v[e] = __float2bfloat16(gelu(xv));
    }
    g[i] = out_g.raw;
    a[i] = out_a.raw;
  }
}

}  // namespace

bool supported(const void* h, const void* g, const void* a, int64_t n) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return n % 8 == 0 && aligned(h) && aligned(g) && aligned(a);
}

// A grid-stride launch over `packs` 8-element pieces: at most 32 blocks an SM.
unsigned blocks_for(int64_t packs) {
  const int64_t wanted = (packs + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<int64_t>(wanted, int64_t{32} * kernels::sm_count()));
}

void backward_and_forward(const void* h, void* g, void* a, int64_t n, void* stream) {
  const int64_t packs = n / 8;
  if (packs == 0) return;
  backward_and_forward_kernel<<<blocks_for(packs), kThreads, 0,
                                static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(h), static_cast<uint4*>(g), static_cast<uint4*>(a), packs);
  kernels::check_launch("gelu", "backward_and_forward_kernel");
}

void forward(const void* h, void* a, int64_t n, void* stream) {
  const int64_t packs = n / 8;
  if (packs == 0) return;
  forward_kernel<<<blocks_for(packs), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(h), static_cast<uint4*>(a), packs);
  kernels::check_launch("gelu", "forward_kernel");
}

}  // namespace slipstream::aero::gelu_kernels
