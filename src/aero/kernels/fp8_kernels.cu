#include "aero/kernels/fp8_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "aero/kernels/common/launch.h"

#include <stdexcept>

namespace slipstream::aero::fp8_kernels {
namespace {

// A 32 x 32 tile a block, 32 x 8 threads: each thread takes four rows of
// one column, so that both the row-major and the transposed stores run
// along a warp's 32 lanes.
constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;

__device__ __forceinline__ float load(const void* in, bool in_fp32, int64_t i) {
  return in_fp32 ? static_cast<const float*>(in)[i]
                 : __bfloat162float(static_cast<const __nv_bfloat16*>(in)[i]);
}

template <__nv_fp8_interpretation_t kFormat>
__global__ void __launch_bounds__(kTile* kRowsPerPass)
    quantize_kernel(const void* __restrict__ in, bool in_fp32, int64_t rows, int64_t rows_out,
                    int64_t cols, const float* __restrict__ scale, uint8_t* __restrict__ out,
                    uint8_t* __restrict__ out_t, float* __restrict__ amax) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  __shared__ float warp_max[kRowsPerPass];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const float s = scale[0];
  float m = 0.f;
  for (int j = ty; j < kTile; j += kRowsPerPass) {
    const int64_t r = row0 + j, c = col0 + tx;
    uint8_t q = 0;  // fp8 zero, also in the padding rows
    if (r < rows && c < cols) {
      const float v = load(in, in_fp32, r * cols + c);
      m = isfinite(v) ? fmaxf(m, fabsf(v)) : INFINITY;
      q = __nv_cvt_float_to_fp8(v * s, __NV_SATFINITE, kFormat);
    }
    if (out != nullptr && r < rows_out && c < cols) out[r * cols + c] = q;
    tile[j][tx] = q;
  }
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (tx == 0) warp_max[ty] = m;
  __syncthreads();
  if (ty == 0 && tx == 0) {
    float b = 0.f;
    for (int w = 0; w < kRowsPerPass; ++w) b = fmaxf(b, warp_max[w]);
    // Non-negative floats order as their bits do.
    if (b > 0.f) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(b));
  }
  if (out == nullptr || out_t == nullptr) return;
  for (int j = ty; j < kTile; j += kRowsPerPass) {
    const int64_t c = col0 + j, r = row0 + tx;
    if (r < rows_out && c < cols) out_t[c * rows_out + r] = tile[tx][j];
  }
}

__global__ void update_scales_kernel(float* amax, float* history, float* scale, float* scale_inv,
                                     int64_t inv_stride, const float* limit, int64_t count,
                                     int history_len, float divisor, int64_t* cursor) {
  const int64_t at = *cursor % history_len;
  for (int64_t s = threadIdx.x; s < count; s += blockDim.x) {
    float a = amax[s];
    if (!isfinite(a)) a = 0.f;
    float* h = history + s * history_len;
    h[at] = a;
    amax[s] = 0.f;
    float m = 0.f;
    for (int i = 0; i < history_len; ++i) m = fmaxf(m, h[i]);
    if (m > 0.f) {
      const float sc = limit[s] / m / divisor;
      scale[s] = sc;
      scale_inv[s * inv_stride] = 1.f / sc;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) *cursor += 1;
}

__global__ void scale_from_amax_kernel(const float* amax, float limit, float divisor, float* scale,
                                       float* scale_inv) {
  const float a = amax[0];
  const float sc = (a > 0.f && isfinite(a)) ? limit / a / divisor : 1.f;
  scale[0] = sc;
  scale_inv[0] = 1.f / sc;
}

float divisor_of(int margin) { return static_cast<float>(1ull << margin); }

}  // namespace

float max_finite(Format f) { return f == Format::kE4M3 ? 448.f : 57344.f; }

void quantize(const void* in, bool in_fp32, int64_t rows, int64_t rows_out, int64_t cols,
              const float* scale, Format format, uint8_t* out, uint8_t* out_t, float* amax,
              void* stream) {
  if (rows_out < rows) throw std::invalid_argument("fp8 quantize: rows_out below rows");
  if (rows_out <= 0 || cols <= 0) return;
  const dim3 grid(static_cast<unsigned>((rows_out + kTile - 1) / kTile),
                  static_cast<unsigned>((cols + kTile - 1) / kTile));
  const dim3 block(kTile, kRowsPerPass);
  auto* st = static_cast<cudaStream_t>(stream);
  if (format == Format::kE4M3) {
    quantize_kernel<__NV_E4M3>
        <<<grid, block, 0, st>>>(in, in_fp32, rows, rows_out, cols, scale, out, out_t, amax);
  } else {
    quantize_kernel<__NV_E5M2>
        <<<grid, block, 0, st>>>(in, in_fp32, rows, rows_out, cols, scale, out, out_t, amax);
  }
  kernels::check_launch("fp8", "quantize_kernel");
}

void update_scales(float* amax, float* history, float* scale, float* scale_inv, int64_t inv_stride,
                   const float* limit, int64_t count, int history_len, int margin, int64_t* cursor,
                   void* stream) {
  if (count <= 0) return;
  update_scales_kernel<<<1, 1024, 0, static_cast<cudaStream_t>(stream)>>>(
      amax, history, scale, scale_inv, inv_stride, limit, count, history_len, divisor_of(margin),
      cursor);
  kernels::check_launch("fp8", "update_scales_kernel");
}

void scale_from_amax(const float* amax, float limit, int margin, float* scale, float* scale_inv,
                     void* stream) {
  scale_from_amax_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      amax, limit, divisor_of(margin), scale, scale_inv);
  kernels::check_launch("fp8", "scale_from_amax_kernel");
}

}  // namespace slipstream::aero::fp8_kernels
