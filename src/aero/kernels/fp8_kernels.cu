#include "aero/kernels/fp8_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "aero/kernels/column_sum_kernels.h"
#include "aero/kernels/common/fp8.cuh"
#include "aero/kernels/common/gelu.cuh"
#include "aero/kernels/common/launch.h"

#include <algorithm>
#include <cstdint>
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

// The same cast, vectorised, for the common case (cols a multiple of 8,
// every pointer 16-byte aligned, rows_out a multiple of 16): a tile of 128
// rows x 128 columns at a time. A thread has 8 packs of 8 values in a tile
// (rows 16 apart) and loads them kHeld at a time before it casts them (64
// bytes of bf16 a thread in flight; 4 measured faster than 2 or 8); the
// row-major bytes go out 8 a thread, 128 contiguous a tile row. In shared
// memory the tile is kept as 32-bit words, word w of row r at
// swizzled(r, w), so that the transposed copy reads 4 columns x 16 rows a
// thread with no bank conflict, turns them into the 4 columns' 16 bytes
// with byte permutes and stores a column's 128 tile rows as one 128-byte
// segment from 8 lanes. Blocks stride over the tiles, so that the amax
// takes one atomic a block.
constexpr int kVecRows = 128, kVecCols = 128;
constexpr int kVecThreads = 256;
constexpr int kPackThreads = kVecCols / 8;             // threads along a tile row
constexpr int kPassRows = kVecThreads / kPackThreads;  // tile rows a pass
constexpr int kPasses = kVecRows / kPassRows;
constexpr int kTileWords = kVecCols / 4;  // 32-bit words a tile row
constexpr int kHeld = 4;                  // passes loaded before their casts

using kernels::fp8::bounded_max;

// 8 values' fp8 bytes, scaled by s, in one 8-byte word.
template <__nv_fp8_interpretation_t kFormat>
__device__ __forceinline__ uint2 pack8(const float (&v)[8], float s) {
  return make_uint2(static_cast<uint32_t>(kernels::fp8::pair<kFormat>(v[0], v[1], s)) |
                        (static_cast<uint32_t>(kernels::fp8::pair<kFormat>(v[2], v[3], s)) << 16),
                    static_cast<uint32_t>(kernels::fp8::pair<kFormat>(v[4], v[5], s)) |
                        (static_cast<uint32_t>(kernels::fp8::pair<kFormat>(v[6], v[7], s)) << 16));
}

using VecTile = uint32_t[kVecRows][kTileWords];

// Where word w of tile row r is kept: w with a multiple of 4 (below
// kTileWords) flipped per group of 16 rows.
__device__ __forceinline__ int swizzled(int r, int w) { return w ^ (((r / 16) % 8) * 4); }

// The 8 bytes of tile row lr, columns lc .. lc + 7 (lc a multiple of 8:
// the two words stay side by side under the swizzle).
__device__ __forceinline__ void tile_store(VecTile& tile, int lr, int lc, uint2 packed) {
  *reinterpret_cast<uint2*>(&tile[lr][swizzled(lr, lc / 4)]) = packed;
}

// The tile's transposed copy into out_t (cols, rows_out): lane l of warp w
// takes word 4 w + l / 8 (4 columns) of rows 16 (l % 8) .. + 15, so that 8
// lanes store a column's 128 bytes. Ends with a barrier (the tile may then
// be rewritten).
__device__ __forceinline__ void store_transposed(const VecTile& tile, uint8_t* out_t, int64_t row0,
                                                 int64_t col0, int64_t rows_out, int64_t cols) {
  if (out_t != nullptr) {
    __syncthreads();
    const int lane = threadIdx.x % 32, rg = lane % 8;
    const int w = (threadIdx.x / 32) * 4 + lane / 8;
    const int64_t orow = row0 + 16 * rg, oc = col0 + 4 * w;
    // rows_out is a multiple of 16: a group of 16 rows is wholly in or out;
    // cols is one of 8: so are a word's 4 columns.
    if (orow < rows_out && oc < cols) {
      const auto word = [&](int i) { return tile[16 * rg + i][swizzled(16 * rg + i, w)]; };
      kernels::fp8::store_columns16(word, out_t, rows_out, oc, orow);
    }
  }
  __syncthreads();
}

// amax[0] = max(amax[0], the block's largest m): one atomic a block.
__device__ __forceinline__ void block_amax(float m, float* warp_max, float* amax) {
  kernels::fp8::block_amax<kVecThreads>(m, warp_max, amax);
}

// 8 consecutive values of the input (bf16 or fp32) as they were loaded.
template <bool kFp32>
struct Raw8 {
  uint4 w[kFp32 ? 2 : 1];

  __device__ __forceinline__ void load(const void* in, int64_t i) {  // i a multiple of 8
    if constexpr (kFp32) {
      const auto* p = reinterpret_cast<const uint4*>(static_cast<const float*>(in) + i);
      w[0] = p[0];
      w[1] = p[1];
    } else {
      w[0] = *reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(in) + i);
    }
  }

  __device__ __forceinline__ void values(float (&v)[8]) const {
    if constexpr (kFp32) {
      const uint32_t u[8] = {w[0].x, w[0].y, w[0].z, w[0].w, w[1].x, w[1].y, w[1].z, w[1].w};
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = __uint_as_float(u[k]);
    } else {
      const auto* h = reinterpret_cast<const __nv_bfloat162*>(&w[0]);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(h[k]);
        v[2 * k] = f.x;
        v[2 * k + 1] = f.y;
      }
    }
  }
};

template <__nv_fp8_interpretation_t kFormat, bool kFp32>
__global__ void __launch_bounds__(kVecThreads, 2)
    quantize_vec_kernel(const void* __restrict__ in, int64_t rows, int64_t rows_out, int64_t cols,
                        int64_t tile_cols, int64_t tiles, const float* __restrict__ scale,
                        uint8_t* __restrict__ out, uint8_t* __restrict__ out_t,
                        float* __restrict__ amax) {
  __shared__ __align__(16) VecTile tile;
  __shared__ float warp_max[kVecThreads / 32];
  const int tid = threadIdx.x;
  const float s = scale[0];
  float m = 0.f;
  const int lc = (tid % kPackThreads) * 8, lr0 = tid / kPackThreads;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t row0 = (t / tile_cols) * kVecRows, col0 = (t % tile_cols) * kVecCols;
    const int64_t c = col0 + lc;
#pragma unroll 1
    for (int p0 = 0; p0 < kPasses; p0 += kHeld) {
      Raw8<kFp32> raw[kHeld];
      bool valid[kHeld];
#pragma unroll
      for (int p = 0; p < kHeld; ++p) {
        const int64_t r = row0 + lr0 + (p0 + p) * kPassRows;
        valid[p] = c < cols && r < rows;
        if (valid[p]) raw[p].load(in, r * cols + c);
      }
#pragma unroll
      for (int p = 0; p < kHeld; ++p) {
        const int lr = lr0 + (p0 + p) * kPassRows;
        const int64_t r = row0 + lr;
        uint2 packed = make_uint2(0u, 0u);  // fp8 zeros, also in the padding rows
        if (valid[p]) {
          float v[8];
          raw[p].values(v);
#pragma unroll
          for (int k = 0; k < 8; ++k) m = bounded_max(m, v[k]);
          packed = pack8<kFormat>(v, s);
        }
        if (out != nullptr && c < cols && r < rows_out) {
          *reinterpret_cast<uint2*>(out + r * cols + c) = packed;
        }
        tile_store(tile, lr, lc, packed);
      }
    }
    store_transposed(tile, out_t, row0, col0, rows_out, cols);
  }
  block_amax(m, warp_max, amax);
}

// The casts of gelu(h) (kBackward false) and of g gelu'(h) (kBackward
// true), each value rounded to bf16 first (kernels/common/gelu.cuh), in
// the vectorised kernel's tiles; a block owns one strip of kVecCols
// columns (blockIdx.y) and walks its row tiles blockIdx.x, + gridDim.x,
// ..., so that with `partial` it also sums its rows of each column (of the
// bf16 values) and writes them as its row of partial, in a fixed order.
// kForwardToo (with kBackward): the same pass also casts gelu(h) itself,
// as the forward kernel does, in e4m3 at fwd_scale, into fwd_out_t alone
// (the transposed copy), its amax into fwd_amax.
// At most one wave of blocks: each first fills its GELU tables.
template <__nv_fp8_interpretation_t kFormat, bool kBackward, bool kForwardToo = false>
__global__ void __launch_bounds__(kVecThreads, 2)
    gelu_quantize_kernel(const uint4* __restrict__ h, const uint4* __restrict__ g, int64_t rows,
                         int64_t rows_out, int64_t cols, const float* __restrict__ scale,
                         uint8_t* __restrict__ out, uint8_t* __restrict__ out_t,
                         float* __restrict__ amax, float* __restrict__ partial,
                         const float* __restrict__ fwd_scale, uint8_t* __restrict__ fwd_out_t,
                         float* __restrict__ fwd_amax) {
  static_assert(kBackward || !kForwardToo, "the forward copy rides on the backward pass");
  namespace gelu = kernels::gelu;
  constexpr bool kValues = !kBackward || kForwardToo;
  __shared__ __align__(16) VecTile tile;
  __shared__ float warp_max[kVecThreads / 32];
  // kForwardToo: the forward copy's tile and gelu's table in dynamic shared
  // memory (launch_gelu's kDynamic bytes), past the 48 KB of static arrays.
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  __shared__ __nv_bfloat16 value_static[kValues && !kForwardToo ? gelu::kEntries : 1];
  auto& fwd_words = *reinterpret_cast<VecTile*>(dynamic_smem);
  __nv_bfloat16* const value =
      kForwardToo ? reinterpret_cast<__nv_bfloat16*>(dynamic_smem + sizeof(VecTile)) : value_static;
  __shared__ float slope[kBackward ? gelu::kEntries : 1];
  __shared__ float sums[kBackward ? kVecThreads / 32 : 1][kVecCols];
  gelu::fill_tables(kValues ? value : nullptr, kBackward ? slope : nullptr);
  const int tid = threadIdx.x;
  const float s = scale[0];
  const float fs = kForwardToo ? fwd_scale[0] : 0.f;
  float m = 0.f, fm = 0.f;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  const int lc = (tid % kPackThreads) * 8, lr0 = tid / kPackThreads;
  const int64_t col0 = int64_t(blockIdx.y) * kVecCols, c = col0 + lc, packs_per_row = cols / 8;
  const int64_t row_tiles = rows_out / kVecRows + (rows_out % kVecRows != 0);
  for (int64_t t = blockIdx.x; t < row_tiles; t += gridDim.x) {
    const int64_t row0 = t * kVecRows;
#pragma unroll 1
    for (int p0 = 0; p0 < kPasses; p0 += kHeld) {
      gelu::Pack8 x[kHeld], dy[kBackward ? kHeld : 1];
      bool valid[kHeld];
#pragma unroll
      for (int p = 0; p < kHeld; ++p) {
        const int64_t r = row0 + lr0 + (p0 + p) * kPassRows;
        valid[p] = c < cols && r < rows;
        if (valid[p]) {
          const int64_t i = r * packs_per_row + c / 8;
          x[p].raw = h[i];
          if constexpr (kBackward) dy[p].raw = g[i];
        }
      }
#pragma unroll
      for (int p = 0; p < kHeld; ++p) {
        const int lr = lr0 + (p0 + p) * kPassRows;
        const int64_t r = row0 + lr;
        uint2 packed = make_uint2(0u, 0u);  // fp8 zeros, also in the padding rows
        uint2 fwd_packed = make_uint2(0u, 0u);
        if (valid[p]) {
          gelu::Pack8 y;
          if constexpr (kBackward) {
            gelu::slope_pack(x[p], dy[p], slope, y);
          } else {
            gelu::forward_pack(x[p], value, y);
          }
          float v[8];
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            v[k] = __bfloat162float(y.v[k]);
            m = bounded_max(m, v[k]);
            if constexpr (kBackward) acc[k] += v[k];
          }
          packed = pack8<kFormat>(v, s);
          if constexpr (kForwardToo) {
            gelu::forward_pack(x[p], value, y);
#pragma unroll
            for (int k = 0; k < 8; ++k) {
              v[k] = __bfloat162float(y.v[k]);
              fm = bounded_max(fm, v[k]);
            }
            fwd_packed = pack8<__NV_E4M3>(v, fs);
          }
        }
        if (out != nullptr && c < cols && r < rows_out) {
          *reinterpret_cast<uint2*>(out + r * cols + c) = packed;
        }
        tile_store(tile, lr, lc, packed);
        if constexpr (kForwardToo) {
          tile_store(fwd_words, lr, lc, fwd_packed);
        }
      }
    }
    store_transposed(tile, out_t, row0, col0, rows_out, cols);
    if constexpr (kForwardToo) {
      store_transposed(fwd_words, fwd_out_t, row0, col0, rows_out, cols);
    }
  }
  block_amax(m, warp_max, amax);
  if constexpr (kForwardToo) block_amax(fm, warp_max, fwd_amax);
  if constexpr (kBackward) {
    if (partial == nullptr) return;
    // A warp's 2 threads of each 8-column piece (lanes 16 apart), then the
    // warps in order.
    static_assert(kPackThreads == 16, "a warp holds two threads of each column piece");
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], 16);
    if (tid % 32 < kPackThreads) {
#pragma unroll
      for (int k = 0; k < 8; ++k) sums[tid / 32][lc + k] = acc[k];
    }
    __syncthreads();
    if (tid < kVecCols && col0 + tid < cols) {
      float total = 0.f;
      for (int w = 0; w < kVecThreads / 32; ++w) total += sums[w][tid];
      partial[int64_t(blockIdx.x) * cols + col0 + tid] = total;
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <__nv_fp8_interpretation_t kFormat>
void launch_quantize(const void* in, bool in_fp32, int64_t rows, int64_t rows_out, int64_t cols,
                     const float* scale, uint8_t* out, uint8_t* out_t, float* amax,
                     cudaStream_t st) {
  if (out == nullptr) out_t = nullptr;  // neither is written
  const bool vec = cols % 8 == 0 && aligned16(in) && (out == nullptr || aligned16(out)) &&
                   (out_t == nullptr || aligned16(out_t)) && rows_out % 16 == 0;
  if (vec) {
    const int64_t tile_rows = (rows_out + kVecRows - 1) / kVecRows;
    const int64_t tile_cols = (cols + kVecCols - 1) / kVecCols;
    const int64_t tiles = tile_rows * tile_cols;
    const auto grid = static_cast<unsigned>(
        std::min<int64_t>(tiles, static_cast<int64_t>(kernels::sm_count()) * 8));
    if (in_fp32) {
      quantize_vec_kernel<kFormat, true><<<grid, kVecThreads, 0, st>>>(
          in, rows, rows_out, cols, tile_cols, tiles, scale, out, out_t, amax);
    } else {
      quantize_vec_kernel<kFormat, false><<<grid, kVecThreads, 0, st>>>(
          in, rows, rows_out, cols, tile_cols, tiles, scale, out, out_t, amax);
    }
    return;
  }
  const dim3 grid(static_cast<unsigned>((rows_out + kTile - 1) / kTile),
                  static_cast<unsigned>((cols + kTile - 1) / kTile));
  const dim3 block(kTile, kRowsPerPass);
  quantize_kernel<kFormat>
      <<<grid, block, 0, st>>>(in, in_fp32, rows, rows_out, cols, scale, out, out_t, amax);
}

// The gelu kernels' grid: (row chunks, column strips), at most one wave
// of blocks in all and at most one chunk a row tile.
template <__nv_fp8_interpretation_t kFormat, bool kBackward>
dim3 gelu_grid(int64_t rows_out, int64_t cols) {
  static const int per_sm = [] {
    int n = 0;
    kernels::check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                            &n, gelu_quantize_kernel<kFormat, kBackward>, kVecThreads, 0),
                        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    return std::max(n, 1);
  }();
  const int64_t strips = (cols + kVecCols - 1) / kVecCols;
  const int64_t row_tiles = std::max<int64_t>(1, (rows_out + kVecRows - 1) / kVecRows);
  const int64_t wave = int64_t(kernels::sm_count()) * per_sm;
  const int64_t chunks = std::clamp<int64_t>(wave / strips, 1, row_tiles);
  return dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(strips));
}

template <__nv_fp8_interpretation_t kFormat, bool kBackward, bool kForwardToo = false>
void launch_gelu(const void* h, const void* g, int64_t rows, int64_t rows_out, int64_t cols,
                 const float* scale, uint8_t* out, uint8_t* out_t, float* amax, float* partial,
                 const GeluForwardCopy* also, cudaStream_t st) {
  // The forward copy's form takes the plain backward's grid: `partial`
  // has a row for each of its row chunks (gelu_partial_rows).
  constexpr size_t kDynamic =
      kForwardToo ? sizeof(VecTile) + sizeof(__nv_bfloat16) * kernels::gelu::kEntries : 0;
  if constexpr (kForwardToo) {
    static const bool opted_in = [] {
      kernels::check_cuda(
          cudaFuncSetAttribute(gelu_quantize_kernel<kFormat, kBackward, kForwardToo>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, int(kDynamic)),
          "cudaFuncSetAttribute");
      return true;
    }();
    (void)opted_in;
  }
  gelu_quantize_kernel<kFormat, kBackward, kForwardToo>
      <<<gelu_grid<kFormat, kBackward>(rows_out, cols), kVecThreads, kDynamic, st>>>(
          static_cast<const uint4*>(h), static_cast<const uint4*>(g), rows, rows_out, cols, scale,
          out, out_t, amax, partial, also != nullptr ? also->scale : nullptr,
          also != nullptr ? also->out_t : nullptr, also != nullptr ? also->amax : nullptr);
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
  auto* st = static_cast<cudaStream_t>(stream);
  if (format == Format::kE4M3) {
    launch_quantize<__NV_E4M3>(in, in_fp32, rows, rows_out, cols, scale, out, out_t, amax, st);
  } else {
    launch_quantize<__NV_E5M2>(in, in_fp32, rows, rows_out, cols, scale, out, out_t, amax, st);
  }
  kernels::check_launch("fp8", "quantize_kernel");
}

bool gelu_supported(int64_t rows_out, int64_t cols, const void* h, const void* g,
                    const uint8_t* out, const uint8_t* out_t, const GeluForwardCopy* also) {
  return cols > 0 && cols % 8 == 0 && rows_out % 16 == 0 && aligned16(h) &&
         (g == nullptr || aligned16(g)) && (out == nullptr || aligned16(out)) &&
         (out_t == nullptr || aligned16(out_t)) &&
         (also == nullptr ||
          (g != nullptr && out != nullptr && also->out_t != nullptr && aligned16(also->out_t)));
}

int64_t gelu_partial_rows(int64_t rows_out, int64_t cols, Format format) {
  return (format == Format::kE4M3 ? gelu_grid<__NV_E4M3, true>
                                  : gelu_grid<__NV_E5M2, true>)(rows_out, cols)
      .x;
}

void quantize_gelu(const void* h, const void* g, int64_t rows, int64_t rows_out, int64_t cols,
                   const float* scale, Format format, uint8_t* out, uint8_t* out_t, float* amax,
                   float* partial, float* colsum, void* stream, const GeluForwardCopy* also) {
  if (rows_out < rows) throw std::invalid_argument("fp8 quantize_gelu: rows_out below rows");
  if (!gelu_supported(rows_out, cols, h, g, out, out_t, also)) {
    throw std::invalid_argument(
        "fp8 quantize_gelu: needs cols a multiple of 8, rows_out of 16, 16-byte aligned pointers "
        "(and, for the forward copy too, GELU's backward writing its own copy)");
  }
  if (g == nullptr && (partial != nullptr || colsum != nullptr)) {
    throw std::invalid_argument("fp8 quantize_gelu: column sums are of GELU's backward alone");
  }
  if (rows_out <= 0) return;
  if (out == nullptr) out_t = nullptr;  // neither is written
  if (colsum == nullptr) partial = nullptr;
  auto* st = static_cast<cudaStream_t>(stream);
  const bool e4m3 = format == Format::kE4M3;
  if (g == nullptr) {
    (e4m3 ? launch_gelu<__NV_E4M3, false>
          : launch_gelu<__NV_E5M2, false>)(h, g, rows, rows_out, cols, scale, out, out_t, amax,
                                           nullptr, nullptr, st);
  } else if (also != nullptr) {
    (e4m3 ? launch_gelu<__NV_E4M3, true, true>
          : launch_gelu<__NV_E5M2, true, true>)(h, g, rows, rows_out, cols, scale, out, out_t, amax,
                                                partial, also, st);
  } else {
    (e4m3 ? launch_gelu<__NV_E4M3, true> : launch_gelu<__NV_E5M2, true>)(h, g, rows, rows_out, cols,
                                                                         scale, out, out_t, amax,
                                                                         partial, nullptr, st);
  }
  kernels::check_launch("fp8", "gelu_quantize_kernel");
  if (partial != nullptr) {
    column_sum_kernels::finish(partial, gelu_partial_rows(rows_out, cols, format), cols, colsum,
                               stream);
  }
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
