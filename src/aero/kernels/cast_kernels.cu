#include "aero/kernels/cast_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "aero/kernels/common/launch.h"

namespace slipstream::aero::cast_kernels {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) cast_kernel(const Chunk* __restrict__ chunks) {
  const Chunk c = chunks[blockIdx.x];
  auto* dst = static_cast<__nv_bfloat16*>(c.dst);
  for (int64_t i = threadIdx.x; i < c.n; i += kThreads) dst[i] = __float2bfloat16_rn(c.src[i]);
}

}  // namespace

void cast_chunks(const Chunk* chunks, int64_t count, void* stream) {
  if (count <= 0) return;
  // One block a chunk: grid.x takes up to 2^31 - 1.
  cast_kernel<<<static_cast<unsigned>(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      chunks);
  kernels::check_launch("parameter casts", "cast_kernel");
}

}  // namespace slipstream::aero::cast_kernels
