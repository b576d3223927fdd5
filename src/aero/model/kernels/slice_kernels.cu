// The slice kernels of physics attention: see slice_kernels.h for the maths
// and layouts. Every kernel owns one (batch, head) per block and a run of
// point tiles, and recomputes the points x slices weights from x instead of
// reading them; they never reach global memory.
//
// The forward kernels (lse, reduce, expand) keep the weights in registers:
// mma.sync m16n8k16 products whose accumulators are turned into weights in
// place and fed back as the next product's operand (see "the forward
// kernels" below). The backward kernel works on 32-point tiles through
// shared memory: WMMA products (bf16 in, fp32 accumulate) write the tile's
// logits and weight gradients there, a row pass (8-16 threads a row) does
// the softmax backward, and further products form grad_x, grad_fx and the
// sums over points for grad_ws.
#include "aero/model/kernels/slice_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace slipstream::aero::slice_kernels {
namespace {

using bf16 = __nv_bfloat16;
namespace wmma = nvcuda::wmma;

constexpr int kTile = 32;  // points per tile
constexpr int kMaxSlices = 256;
// A block of W warps. The row passes give each of a tile's point rows
// Cfg<W>::kThreads / kTile threads of one warp, each holding every Cfg<W>::kRowThreads-th
// slice value of the row in registers. The forward kernels run 8 warps (two
// blocks fit on a multiprocessor), the backward 16 (only one fits: its
// shared memory), so that each multiprocessor has 16 warps to switch among.
template <int W>
struct Cfg {
  static constexpr int kWarps = W;
  static constexpr int kThreads = 32 * W;
  static constexpr int kRowThreads = kThreads / kTile;
  static constexpr int kPerThread = kMaxSlices / kRowThreads;
  static constexpr int kQuads = kPerThread / 4;  // a thread's columns come in runs of 4
  static_assert(kRowThreads == 8 || kRowThreads == 16, "a row's threads must share a warp");
};

// Column of a thread's q-th value in a row: runs of 4 adjacent columns, so
// that rows move through shared memory as float4 and 4 x bf16.
template <int W>
__device__ inline int row_col(int part, int q) {
  return 4 * part + 4 * Cfg<W>::kRowThreads * (q / 4) + q % 4;
}

__device__ inline void store_bf16x4(bf16* dst, float a, float b, float c, float d) {
  union {
    __nv_bfloat162 h[2];
    uint2 u;
  } v;
  v.h[0] = __floats2bfloat162_rn(a, b);
  v.h[1] = __floats2bfloat162_rn(c, d);
  *reinterpret_cast<uint2*>(dst) = v.u;
}

// Sums over a tile's rows of a (kTile x G) bf16 matrix in shared memory (the
// weights or their gradient as the products use them), per column, in fp32
// registers across tiles: each thread owns 4 adjacent columns and every
// (kThreads / 64)-th row.
template <int W>
struct ColumnSum {
  static constexpr int kRowGroups = Cfg<W>::kThreads / 64;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);

  __device__ void add(const bf16* m, int ld, int g) {
    const int q = threadIdx.x % 64, rg = threadIdx.x / 64;
    if (4 * q >= g) return;
    for (int r = rg; r < kTile; r += kRowGroups) {
      union {
        uint2 u;
        __nv_bfloat162 h[2];
      } v;
      v.u = *reinterpret_cast<const uint2*>(m + r * ld + 4 * q);
      const float2 lo = __bfloat1622float2(v.h[0]), hi = __bfloat1622float2(v.h[1]);
      acc.x += lo.x;
      acc.y += lo.y;
      acc.z += hi.x;
      acc.w += hi.y;
    }
  }

  __device__ void flush(float* out, int g) const {
    const int q = threadIdx.x % 64;
    if (4 * q >= g) return;
    atomicAdd(out + 4 * q, acc.x);
    atomicAdd(out + 4 * q + 1, acc.y);
    atomicAdd(out + 4 * q + 2, acc.z);
    atomicAdd(out + 4 * q + 3, acc.w);
  }
};
constexpr int kBackwardWarps = 16;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAt = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// The backward kernel's shared-memory layout, the same on host (for the
// launch size) and device.
// Rows of D bf16 are padded to D + 8, rows of G bf16 to G + 8 and rows of G
// floats to G + 8, which keeps WMMA's alignment and spreads the banks.
struct Plan {
  int ldk, ldg, ldf;
  size_t ws, bias, gnorm, x, y, go, z, z2, logits, dw, p, pg, stage, bytes;
};

__host__ __device__ inline size_t take(size_t& off, size_t n) {
  const size_t at = (off + 127) / 128 * 128;
  off = at + n;
  return at;
}

__host__ __device__ inline Plan make_plan(int d, int g, int warps) {
  Plan pl{};
  pl.ldk = d + 8;
  pl.ldg = g + 8;
  pl.ldf = g + 8;
  size_t off = 0;
  const size_t mat = size_t(g) * pl.ldk * sizeof(bf16);
  const size_t rows = size_t(kTile) * pl.ldk * sizeof(bf16);
  const size_t f32 = size_t(kTile) * pl.ldf * sizeof(float);
  pl.ws = take(off, mat);
  pl.bias = take(off, g * sizeof(float));
  pl.x = take(off, rows);
  pl.gnorm = take(off, g * sizeof(float));
  pl.y = take(off, rows);
  pl.go = take(off, rows);
  pl.z = take(off, mat);
  pl.z2 = take(off, mat);
  pl.dw = take(off, f32);
  pl.logits = take(off, f32);
  pl.p = take(off, size_t(kTile) * pl.ldg * sizeof(bf16));
  pl.pg = take(off, size_t(kTile) * pl.ldg * sizeof(bf16));
  // Partial 16 x 16 output tiles of the two point products ((kTile/16) x
  // (D/16) tiles each), at least one per warp.
  const int out_tiles = 2 * (kTile / 16) * (d / 16);
  pl.stage = take(off, size_t(out_tiles > warps ? out_tiles : warps) * 256 * sizeof(float));
  pl.bytes = off;
  return pl;
}

template <typename T>
__device__ inline T* at(unsigned char* smem, size_t off) {
  return reinterpret_cast<T*>(smem + off);
}

__device__ inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// The logits are kept in log2 units, z2 = z log2(e), so that each weight
// is one ex2 (the lse stays in natural units in global memory).
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

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

// Over the aligned lanes of a row group (`lanes` of them).
template <int lanes>
__device__ inline float row_sum(float v) {
#pragma unroll
  for (int o = lanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int lanes>
__device__ inline float row_max(float v) {
#pragma unroll
  for (int o = lanes / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The per-(batch, head) context of a block.
struct Head {
  int64_t b, h, bh, n, heads;
  int d, g;
  // Element offset of point n's row for this head in a (B, N, H, D) tensor.
  __device__ int64_t row(int64_t point) const { return ((b * n + point) * heads + h) * d; }
};

// Copies `rows` rows of D bf16 (row r at src + row_offset(r)) into shared
// memory with pitch ldk, zero-filling rows past the end, in 16-byte pieces.
template <int D, int W, typename RowOffset>
__device__ inline void load_rows(bf16* dst, int ldk, const bf16* src, int rows, int valid,
                                 RowOffset row_offset) {
  constexpr int kPieces = D / 8;
  for (int i = threadIdx.x; i < rows * kPieces; i += 32 * W) {
    const int r = i / kPieces, c = i % kPieces;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < valid) v = *reinterpret_cast<const uint4*>(src + row_offset(r) + c * 8);
    *reinterpret_cast<uint4*>(dst + r * ldk + c * 8) = v;
  }
}

// One tile's rows of a (B, N, H, D) tensor, read from global memory into
// registers a tile ahead (fetch), then written to shared memory (store):
// the read's latency hides behind the current tile's work. A tile is at
// most one 16-byte piece per thread (kTile * D / 8 <= 32 * W).
template <int D, int W>
struct TileRows {
  static constexpr int kPieces = D / 8;
  static_assert(kTile * kPieces <= Cfg<W>::kThreads, "one piece per thread");
  uint4 v;

  __device__ void fetch(const bf16* src, const Head& hd, int64_t n0) {
    const int i = threadIdx.x, r = i / kPieces, c = i % kPieces;
    v = make_uint4(0, 0, 0, 0);
    if (i < kTile * kPieces && n0 + r < hd.n) {
      v = *reinterpret_cast<const uint4*>(src + hd.row(n0 + r) + c * 8);
    }
  }

  __device__ void store(bf16* dst, int ldk) const {
    const int i = threadIdx.x, r = i / kPieces, c = i % kPieces;
    if (i < kTile * kPieces) *reinterpret_cast<uint4*>(dst + r * ldk + c * 8) = v;
  }
};

// A (G, D) matrix, contiguous, into shared memory with pitch ldk.
template <int D, int W>
__device__ inline void load_matrix(bf16* dst, int ldk, const bf16* src, int g) {
  load_rows<D, W>(dst, ldk, src, g, g, [](int r) { return int64_t(r) * D; });
}

// C (kTile x G, fp32, ldc) = A (kTile x D) B^T, with B given as (G x D); and
// plus A2 B2^T when A2 is given. Each warp takes whole columns of 16 x 16
// output tiles: it loads its B fragments once and each row tile's A
// fragments once, for all of its columns.
template <int D, int W>
__device__ inline void gemm_nt(const bf16* a, const bf16* bt, const bf16* a2, const bf16* bt2,
                               int ldk, float* c, int ldc, int g) {
  constexpr int kK = D / 16, kCols = (kMaxSlices / 16 + W - 1) / W;
  const int warp = threadIdx.x / 32, col_tiles = g / 16;
  const bool two = a2 != nullptr;
  FragBt fb[kCols][kK], fb2[kCols][kK];
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
    const int nt = warp + i * W;
    if (nt >= col_tiles) break;
#pragma unroll
    for (int k = 0; k < kK; ++k) {
      wmma::load_matrix_sync(fb[i][k], bt + nt * 16 * ldk + k * 16, ldk);
      if (two) wmma::load_matrix_sync(fb2[i][k], bt2 + nt * 16 * ldk + k * 16, ldk);
    }
  }
#pragma unroll
  for (int mt = 0; mt < kTile / 16; ++mt) {
    FragA fa[kK], fa2[kK];
#pragma unroll
    for (int k = 0; k < kK; ++k) {
      wmma::load_matrix_sync(fa[k], a + mt * 16 * ldk + k * 16, ldk);
      if (two) wmma::load_matrix_sync(fa2[k], a2 + mt * 16 * ldk + k * 16, ldk);
    }
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const int nt = warp + i * W;
      if (nt >= col_tiles) break;
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int k = 0; k < kK; ++k) {
        wmma::mma_sync(acc, fa[k], fb[i][k], acc);
        if (two) wmma::mma_sync(acc, fa2[k], fb2[i][k], acc);
      }
      wmma::store_matrix_sync(c + mt * 16 * ldc + nt * 16, acc, ldc, wmma::mem_row_major);
    }
  }
}

// out(r, d) for one or two kTile x D products A (kTile x G, lda) B (G x D,
// ldk): the products' 16 x 16 output tiles are dealt to the warps, split
// along G when there are fewer tiles than warps, the partial tiles summed
// through `stage`, and emit_i(r, d, values) called once per run of 4
// elements (d a multiple of 4) of product i. Syncs the block first (so A and B written by other
// threads are seen), between, and after (so the stage and the inputs may be reused).
template <int D, int W, typename Emit0, typename Emit1>
__device__ inline void gemm_nn_points(const bf16* a0, const bf16* b0, Emit0 emit0, const bf16* a1,
                                      const bf16* b1, Emit1 emit1, int lda, int ldk, int g,
                                      float* stage) {
  constexpr int kPerProduct = (kTile / 16) * (D / 16);
  const int products = a1 != nullptr ? 2 : 1;
  const int tiles = products * kPerProduct;
  const int splits = tiles < Cfg<W>::kWarps ? Cfg<W>::kWarps / tiles : 1;
  const int warp = threadIdx.x / 32, ksteps = g / 16;
  __syncthreads();
  for (int slot = warp; slot < tiles * splits; slot += Cfg<W>::kWarps) {
    const int tile = slot % tiles, s = slot / tiles;
    const int prod = tile / kPerProduct, f = tile % kPerProduct;
    const bf16* a = prod == 0 ? a0 : a1;
    const bf16* b = prod == 0 ? b0 : b1;
    const int mt = f / (D / 16), nt = f % (D / 16);
    const int k0 = s * ksteps / splits, k1 = (s + 1) * ksteps / splits;
    // Two accumulators (even and odd k): two independent MMA chains.
    FragC acc, acc2;
    wmma::fill_fragment(acc, 0.0f);
    wmma::fill_fragment(acc2, 0.0f);
    const bf16* ak = a + mt * 16 * lda;
    const bf16* bk = b + nt * 16;
    int k = k0;
    for (; k + 1 < k1; k += 2) {
      FragA fa, fa2;
      FragB fb, fb2;
      wmma::load_matrix_sync(fa, ak + k * 16, lda);
      wmma::load_matrix_sync(fb, bk + k * 16 * ldk, ldk);
      wmma::load_matrix_sync(fa2, ak + (k + 1) * 16, lda);
      wmma::load_matrix_sync(fb2, bk + (k + 1) * 16 * ldk, ldk);
      wmma::mma_sync(acc, fa, fb, acc);
      wmma::mma_sync(acc2, fa2, fb2, acc2);
    }
    if (k < k1) {
      FragA fa;
      FragB fb;
      wmma::load_matrix_sync(fa, ak + k * 16, lda);
      wmma::load_matrix_sync(fb, bk + k * 16 * ldk, ldk);
      wmma::mma_sync(acc, fa, fb, acc);
    }
#pragma unroll
    for (int i = 0; i < acc.num_elements; ++i) acc.x[i] += acc2.x[i];
    wmma::store_matrix_sync(stage + slot * 256, acc, 16, wmma::mem_row_major);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < products * kTile * D / 4; e += Cfg<W>::kThreads) {
    const int prod = e / (kTile * D / 4), r = (e / (D / 4)) % kTile, d = 4 * (e % (D / 4));
    const int tile = prod * kPerProduct + (r / 16) * (D / 16) + d / 16;
    const int inner = (r % 16) * 16 + d % 16;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int si = 0; si < splits; ++si) {
      const float4 q = *reinterpret_cast<const float4*>(stage + (tile + si * tiles) * 256 + inner);
      v.x += q.x;
      v.y += q.y;
      v.z += q.z;
      v.w += q.w;
    }
    if (prod == 0) {
      emit0(r, d, v);
    } else {
      emit1(r, d, v);
    }
  }
  __syncthreads();
}

// Register-held sums over points of A^T Y, A (kTile x G, lda), Y (kTile x D,
// ldk), giving G x D: the tiles are dealt to the warps round-robin.
template <int D, int W>
struct PointSum {
  static constexpr int kTilesPerWarp = (kMaxSlices / 16) * (D / 16) / Cfg<W>::kWarps;
  FragC acc[kTilesPerWarp];

  __device__ void zero() {
#pragma unroll
    for (int i = 0; i < kTilesPerWarp; ++i) wmma::fill_fragment(acc[i], 0.0f);
  }

  __device__ void add(const bf16* a, int lda, const bf16* y, int ldk, int g) {
    const int warp = threadIdx.x / 32, tiles = (g / 16) * (D / 16);
#pragma unroll
    for (int i = 0; i < kTilesPerWarp; ++i) {
      const int t = warp + i * Cfg<W>::kWarps;
      if (t >= tiles) break;
      const int gt = t / (D / 16), dt = t % (D / 16);
#pragma unroll
      for (int k = 0; k < kTile; k += 16) {
        FragAt fa;
        FragB fb;
        wmma::load_matrix_sync(fa, a + k * lda + gt * 16, lda);
        wmma::load_matrix_sync(fb, y + k * ldk + dt * 16, ldk);
        wmma::mma_sync(acc[i], fa, fb, acc[i]);
      }
    }
  }

  // out (G x D, fp32, global) += the sums, through this warp's 16 x 16 stage.
  __device__ void flush(float* out, int g, float* stage) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tiles = (g / 16) * (D / 16);
    float* mine = stage + warp * 256;
#pragma unroll
    for (int i = 0; i < kTilesPerWarp; ++i) {
      const int t = warp + i * Cfg<W>::kWarps;
      if (t >= tiles) break;
      const int gt = t / (D / 16), dt = t % (D / 16);
      wmma::store_matrix_sync(mine, acc[i], 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        atomicAdd(out + (gt * 16 + e / 16) * D + dt * 16 + e % 16, mine[e]);
      }
      __syncwarp();
    }
  }
};

// Each point row of a tile's logits as z2 = (logit + bias) log2(e) / tau
// (bias2 holds bias log2(e) / tau, scale2 is log2(e) / tau), with the
// row's lse (computed and written, or read) and the slice weights
// w = exp(z - lse), zero for rows past the end. Thread `part` of the row's
// kRowThreads holds its columns (row_col) in registers; `body(r, row, z2,
// w, valid, part)` sees them.
template <int W, typename Body>
__device__ inline void for_each_row(float* logits, int ldf, const float* bias2, float scale2, int g,
                                    const Head& hd, int64_t n0, float* lse, bool compute_lse,
                                    Body body) {
  const int r = threadIdx.x / Cfg<W>::kRowThreads, part = threadIdx.x % Cfg<W>::kRowThreads;
  const int64_t n = n0 + r;
  const bool valid = n < hd.n;
  float* row = logits + r * ldf;
  float z[Cfg<W>::kPerThread], w[Cfg<W>::kPerThread];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < Cfg<W>::kQuads; ++j) {
    const int c = row_col<W>(part, 4 * j);
    if (c < g) {
      const float4 v = *reinterpret_cast<const float4*>(row + c);
      const float4 b = *reinterpret_cast<const float4*>(bias2 + c);
      z[4 * j] = fmaf(v.x, scale2, b.x);
      z[4 * j + 1] = fmaf(v.y, scale2, b.y);
      z[4 * j + 2] = fmaf(v.z, scale2, b.z);
      z[4 * j + 3] = fmaf(v.w, scale2, b.w);
    } else {
      z[4 * j] = z[4 * j + 1] = z[4 * j + 2] = z[4 * j + 3] = -INFINITY;
    }
    m = fmaxf(m, fmaxf(fmaxf(z[4 * j], z[4 * j + 1]), fmaxf(z[4 * j + 2], z[4 * j + 3])));
  }
  if (compute_lse) {
    // One exponential per weight: w = exp2(z2 - max) / sum.
    m = row_max<Cfg<W>::kRowThreads>(m);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < Cfg<W>::kPerThread; ++j) {
      w[j] = exp2_approx(z[j] - m);
      s += w[j];
    }
    s = row_sum<Cfg<W>::kRowThreads>(s);
    const float inv = valid ? 1.0f / s : 0.0f;
#pragma unroll
    for (int j = 0; j < Cfg<W>::kPerThread; ++j) w[j] *= inv;
    if (valid && part == 0) lse[hd.bh * hd.n + n] = (m + __log2f(s)) * kLn2;
  } else {
    const float l2 = valid ? lse[hd.bh * hd.n + n] * kLog2e : 0.0f;
#pragma unroll
    for (int j = 0; j < Cfg<W>::kPerThread; ++j) w[j] = valid ? exp2_approx(z[j] - l2) : 0.0f;
  }
  body(r, row, z, w, valid, part);
}

// Shared-memory bias2 = bias log2(e) / tau for for_each_row; returns scale2.
template <int W>
__device__ inline float load_bias2(float* bias2, const Problem& p, int h, int g) {
  const float scale2 = kLog2e / p.tau[h];
  for (int i = threadIdx.x; i < g; i += 32 * W) bias2[i] = p.bias[i] * scale2;
  return scale2;
}

// ---- the forward kernels: weights in registers (mma.sync m16n8k16) ----
//
// A warp works on 16-point tiles with no shared memory written after the
// block's set-up and no barrier in its loop. Per tile and chunk of 16
// slices it forms the 16 x 16 logits with two MMAs per 16 of D and turns
// them into weights where the MMA left them: each lane holds rows lane/4
// and lane/4 + 8, columns 2 (lane % 4) + {0, 1} of each 8-wide tile
// (fragment layouts: PTX ISA, "Matrix Fragments for mma.m16n8k16"; an
// 8 x 8 block in that row/column pattern is what movmatrix transposes).
//   lse:    rows of 16 points, online log-sum-exp over the chunks.
//   reduce: each warp owns some chunks of slices and walks every tile of
//           the block; the weights, transposed with movmatrix, are the A
//           operand of (slices x points) (points x D).
//   expand: each warp owns its tiles; the weights are the A operand of
//           (points x slices) (slices x D), chunk by chunk.

__device__ inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
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

constexpr int kRowTile = 16;  // points per warp tile in the register kernels
constexpr int kRegWarps = 8;
constexpr int kRegThreads = kRegWarps * 32;

// Shared memory of the register kernels: ws (G x D, pitch D + 8), bias2
// (G) and, for expand, z transposed (D x G, pitch G + 8). The pitches put
// the 32 lanes of each fragment load on 32 different banks.
struct RegPlan {
  int ldk, ldg;
  size_t ws, bias, zt, bytes;
};

__host__ __device__ inline RegPlan make_reg_plan(int d, int g, bool with_z) {
  RegPlan pl{};
  pl.ldk = d + 8;
  pl.ldg = g + 8;
  size_t off = 0;
  pl.ws = take(off, size_t(g) * pl.ldk * sizeof(bf16));
  pl.bias = take(off, g * sizeof(float));
  if (with_z) pl.zt = take(off, size_t(d) * pl.ldg * sizeof(bf16));
  pl.bytes = off;
  return pl;
}

// A warp's view of one 16-point tile: rows a = lane/4 and b = a + 8.
template <int D>
struct PointTile {
  int64_t na, nb;
  bool va, vb;
  uint32_t x[D / 16][4];  // the tile's x rows as A fragments (k = D)
  float la, lb;           // the rows' lse (read when asked)

  __device__ PointTile(const Problem& p, const Head& hd, int64_t t, int lane, bool read_lse) {
    const int r0 = lane / 4, c0 = 2 * (lane % 4);
    na = t * kRowTile + r0;
    nb = na + 8;
    va = na < hd.n;
    vb = nb < hd.n;
    const bf16* x0 = static_cast<const bf16*>(p.x);
    const bf16* xa = x0 + hd.row(va ? na : 0);
    const bf16* xb = x0 + hd.row(vb ? nb : 0);
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
      x[k][0] = va ? load_u32(xa + 16 * k + c0) : 0u;
      x[k][1] = vb ? load_u32(xb + 16 * k + c0) : 0u;
      x[k][2] = va ? load_u32(xa + 16 * k + c0 + 8) : 0u;
      x[k][3] = vb ? load_u32(xb + 16 * k + c0 + 8) : 0u;
    }
    // Nothing here uses a loaded value: a tile can be read a step ahead.
    la = read_lse && va ? p.lse[hd.bh * hd.n + na] : 0.0f;
    lb = read_lse && vb ? p.lse[hd.bh * hd.n + nb] : 0.0f;
  }

  // z2 (log2-unit logits) of slices s0 + 8 j + {c0, c0 + 1} for rows a, b:
  // z[j][0..1] row a, z[j][2..3] row b.
  __device__ void logits(const bf16* ws, int ldk, const float* bias2, float scale2, int s0,
                         int lane, float (&z)[2][4]) const {
    const int r0 = lane / 4, c0 = 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float c[4] = {0.f, 0.f, 0.f, 0.f};
      const bf16* wrow = ws + (s0 + 8 * j + r0) * ldk + c0;
#pragma unroll
      for (int k = 0; k < D / 16; ++k) {
        mma_16816(c, x[k], load_u32(wrow + 16 * k), load_u32(wrow + 16 * k + 8));
      }
      const float b0 = bias2[s0 + 8 * j + c0], b1 = bias2[s0 + 8 * j + c0 + 1];
      z[j][0] = fmaf(c[0], scale2, b0);
      z[j][1] = fmaf(c[1], scale2, b1);
      z[j][2] = fmaf(c[2], scale2, b0);
      z[j][3] = fmaf(c[3], scale2, b1);
    }
  }

  // The weights of a chunk from its logits (zero for rows past the end).
  __device__ void weights(const float (&z)[2][4], float (&w)[2][4]) const {
    const float la2 = la * kLog2e, lb2 = lb * kLog2e;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      w[j][0] = va ? exp2_approx(z[j][0] - la2) : 0.0f;
      w[j][1] = va ? exp2_approx(z[j][1] - la2) : 0.0f;
      w[j][2] = vb ? exp2_approx(z[j][2] - lb2) : 0.0f;
      w[j][3] = vb ? exp2_approx(z[j][3] - lb2) : 0.0f;
    }
  }
};

// ws and bias2 into shared memory (and z transposed when given); syncs.
template <int D>
__device__ inline float reg_setup(const RegPlan& pl, unsigned char* smem, const Problem& p,
                                  const Head& hd, const bf16* z) {
  load_matrix<D, kRegWarps>(at<bf16>(smem, pl.ws), pl.ldk, static_cast<const bf16*>(p.ws), hd.g);
  if (z != nullptr) {
    bf16* zt = at<bf16>(smem, pl.zt);
    for (int i = threadIdx.x; i < hd.g * D; i += kRegThreads) zt[(i % D) * pl.ldg + i / D] = z[i];
  }
  const float scale2 = load_bias2<kRegWarps>(at<float>(smem, pl.bias), p, hd.h, hd.g);
  __syncthreads();
  return scale2;
}

template <int D>
__global__ void __launch_bounds__(kRegThreads) lse_kernel(Problem p, int tiles_per_block) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int g = static_cast<int>(p.slices);
  const RegPlan pl = make_reg_plan(D, g, false);
  Head hd{blockIdx.y / p.heads, blockIdx.y % p.heads, blockIdx.y, p.points, p.heads, D, g};
  const float scale2 = reg_setup<D>(pl, smem, p, hd, nullptr);
  const bf16* ws = at<bf16>(smem, pl.ws);
  const float* bias2 = at<float>(smem, pl.bias);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t tiles = (p.points + kRowTile - 1) / kRowTile;
  const int64_t t0 = int64_t(blockIdx.x) * tiles_per_block;
  const int64_t t1 = imin(tiles, t0 + tiles_per_block);
  for (int64_t t = t0 + warp; t < t1; t += kRegWarps) {
    const PointTile<D> tile(p, hd, t, lane, false);
    float m[2] = {-INFINITY, -INFINITY}, sum[2] = {0.f, 0.f};  // rows a, b
    for (int s0 = 0; s0 < g; s0 += 16) {
      float z[2][4];
      tile.logits(ws, pl.ldk, bias2, scale2, s0, lane, z);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float cm =
            fmaxf(fmaxf(z[0][2 * r], z[0][2 * r + 1]), fmaxf(z[1][2 * r], z[1][2 * r + 1]));
        const float mn = fmaxf(m[r], cm);
        sum[r] = sum[r] * exp2_approx(m[r] - mn) + exp2_approx(z[0][2 * r] - mn) +
                 exp2_approx(z[0][2 * r + 1] - mn) + exp2_approx(z[1][2 * r] - mn) +
                 exp2_approx(z[1][2 * r + 1] - mn);
        m[r] = mn;
      }
    }
    // The four lanes of a row hold its columns between them.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int o = 1; o < 4; o <<= 1) {
        const float mo = __shfl_xor_sync(0xffffffffu, m[r], o);
        const float so = __shfl_xor_sync(0xffffffffu, sum[r], o);
        const float mn = fmaxf(m[r], mo);
        sum[r] = sum[r] * exp2_approx(m[r] - mn) + so * exp2_approx(mo - mn);
        m[r] = mn;
      }
    }
    if (lane % 4 == 0) {
      if (tile.va) p.lse[hd.bh * hd.n + tile.na] = (m[0] + __log2f(sum[0])) * kLn2;
      if (tile.vb) p.lse[hd.bh * hd.n + tile.nb] = (m[1] + __log2f(sum[1])) * kLn2;
    }
  }
}

// Chunks of 16 slices a warp owns in reduce_kernel: q = warp + i W.
constexpr int kOwnedChunks = (kMaxSlices / 16 + kRegWarps - 1) / kRegWarps;

template <int D>
__global__ void __launch_bounds__(kRegThreads)
    reduce_kernel(Problem p, const bf16* __restrict__ y, float* __restrict__ acc_out,
                  float* __restrict__ colsum_out, int tiles_per_block) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int g = static_cast<int>(p.slices);
  const RegPlan pl = make_reg_plan(D, g, false);
  Head hd{blockIdx.y / p.heads, blockIdx.y % p.heads, blockIdx.y, p.points, p.heads, D, g};
  const float scale2 = reg_setup<D>(pl, smem, p, hd, nullptr);
  const bf16* ws = at<bf16>(smem, pl.ws);
  const float* bias2 = at<float>(smem, pl.bias);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int r0 = lane / 4, c0 = 2 * (lane % 4), chunks = g / 16;
  float acc[kOwnedChunks][D / 8][4] = {};
  float cs[kOwnedChunks][2][2] = {};  // slices 8 j + c0 + e, summed over the lane's rows
  const int64_t tiles = (p.points + kRowTile - 1) / kRowTile;
  const int64_t t0 = int64_t(blockIdx.x) * tiles_per_block;
  const int64_t t1 = imin(tiles, t0 + tiles_per_block);
  // y's rows of a tile as raw 8 x 8 blocks (points x D), one row pair a lane.
  const auto read_y = [&](const PointTile<D>& tile, uint32_t(&raw)[D / 8][2]) {
    const bf16* ya = y + hd.row(tile.va ? tile.na : 0);
    const bf16* yb = y + hd.row(tile.vb ? tile.nb : 0);
#pragma unroll
    for (int db = 0; db < D / 8; ++db) {
      raw[db][0] = tile.va ? load_u32(ya + 8 * db + c0) : 0u;
      raw[db][1] = tile.vb ? load_u32(yb + 8 * db + c0) : 0u;
    }
  };
  // Software-pipelined: the next tile's x, y and lse are read while this
  // one is worked on.
  PointTile<D> tile(p, hd, t0, lane, true);
  uint32_t y_raw[D / 8][2];
  read_y(tile, y_raw);
  for (int64_t t = t0; t < t1; ++t) {
    PointTile<D> next = tile;
    uint32_t y_next[D / 8][2] = {};
    if (t + 1 < t1) {
      next = PointTile<D>(p, hd, t + 1, lane, true);
      read_y(next, y_next);
    }
    // y as B fragments (k = points, n = D): the blocks transposed.
    uint32_t yb[D / 8][2];
#pragma unroll
    for (int db = 0; db < D / 8; ++db) {
      yb[db][0] = transpose8(y_raw[db][0]);
      yb[db][1] = transpose8(y_raw[db][1]);
    }
#pragma unroll
    for (int i = 0; i < kOwnedChunks; ++i) {
      const int q = warp + i * kRegWarps;
      if (q < chunks) {
        float z[2][4], w[2][4];
        tile.logits(ws, pl.ldk, bias2, scale2, 16 * q, lane, z);
        tile.weights(z, w);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          cs[i][j][0] += w[j][0] + w[j][2];
          cs[i][j][1] += w[j][1] + w[j][3];
        }
        // The weights' 8 x 8 blocks (points x slices) -> W^T (slices x
        // points) as an A fragment: blocks (0,0), (1,0), (0,1), (1,1) of W^T
        // are the transposes of W's (0,0), (0,1), (1,0), (1,1).
        const uint32_t wt[4] = {
            transpose8(pack_bf16(w[0][0], w[0][1])), transpose8(pack_bf16(w[1][0], w[1][1])),
            transpose8(pack_bf16(w[0][2], w[0][3])), transpose8(pack_bf16(w[1][2], w[1][3]))};
#pragma unroll
        for (int db = 0; db < D / 8; ++db) mma_16816(acc[i][db], wt, yb[db][0], yb[db][1]);
      }
    }
    tile = next;
#pragma unroll
    for (int db = 0; db < D / 8; ++db) {
      y_raw[db][0] = y_next[db][0];
      y_raw[db][1] = y_next[db][1];
    }
  }
  float* out = acc_out + hd.bh * int64_t(g) * D;
#pragma unroll
  for (int i = 0; i < kOwnedChunks; ++i) {
    const int q = warp + i * kRegWarps;
    if (q >= chunks) continue;
#pragma unroll
    for (int db = 0; db < D / 8; ++db) {
      float* o = out + (16 * q + r0) * D + 8 * db + c0;
      atomicAdd(o, acc[i][db][0]);
      atomicAdd(o + 1, acc[i][db][1]);
      atomicAdd(o + 8 * D, acc[i][db][2]);
      atomicAdd(o + 8 * D + 1, acc[i][db][3]);
    }
    if (colsum_out != nullptr) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float v = cs[i][j][e];
          v += __shfl_xor_sync(0xffffffffu, v, 4);
          v += __shfl_xor_sync(0xffffffffu, v, 8);
          v += __shfl_xor_sync(0xffffffffu, v, 16);
          if (lane < 4) atomicAdd(colsum_out + hd.bh * g + 16 * q + 8 * j + c0 + e, v);
        }
      }
    }
  }
}

template <int D>
__global__ void __launch_bounds__(kRegThreads)
    expand_kernel(Problem p, const bf16* __restrict__ z_in, bf16* __restrict__ out,
                  int tiles_per_block) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int g = static_cast<int>(p.slices);
  const RegPlan pl = make_reg_plan(D, g, true);
  Head hd{blockIdx.y / p.heads, blockIdx.y % p.heads, blockIdx.y, p.points, p.heads, D, g};
  const float scale2 = reg_setup<D>(pl, smem, p, hd, z_in + hd.bh * int64_t(g) * D);
  const bf16* ws = at<bf16>(smem, pl.ws);
  const bf16* zt = at<bf16>(smem, pl.zt);
  const float* bias2 = at<float>(smem, pl.bias);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int r0 = lane / 4, c0 = 2 * (lane % 4);
  const int64_t tiles = (p.points + kRowTile - 1) / kRowTile;
  const int64_t t0 = int64_t(blockIdx.x) * tiles_per_block;
  const int64_t t1 = imin(tiles, t0 + tiles_per_block);
  for (int64_t t = t0 + warp; t < t1; t += kRegWarps) {
    const PointTile<D> tile(p, hd, t, lane, true);
    float acc[D / 8][4] = {};
    for (int s0 = 0; s0 < g; s0 += 16) {
      float z[2][4], w[2][4];
      tile.logits(ws, pl.ldk, bias2, scale2, s0, lane, z);
      tile.weights(z, w);
      // The weights as an A fragment (points x slices): blocks (0,0), (1,0),
      // (0,1), (1,1).
      const uint32_t pw[4] = {pack_bf16(w[0][0], w[0][1]), pack_bf16(w[0][2], w[0][3]),
                              pack_bf16(w[1][0], w[1][1]), pack_bf16(w[1][2], w[1][3])};
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        const bf16* zrow = zt + (8 * dt + r0) * pl.ldg + s0 + c0;
        mma_16816(acc[dt], pw, load_u32(zrow), load_u32(zrow + 8));
      }
    }
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      const int d = 8 * dt + c0;
      if (tile.va) {
        *reinterpret_cast<uint32_t*>(out + hd.row(tile.na) + d) = pack_bf16(acc[dt][0], acc[dt][1]);
      }
      if (tile.vb) {
        *reinterpret_cast<uint32_t*>(out + hd.row(tile.nb) + d) = pack_bf16(acc[dt][2], acc[dt][3]);
      }
    }
  }
}

template <int D, int W = kBackwardWarps>
__global__ void __launch_bounds__(Cfg<W>::kThreads, 1)
    backward_kernel(Problem p, const bf16* __restrict__ fx, const bf16* __restrict__ gout,
                    const bf16* __restrict__ os, const bf16* __restrict__ gs,
                    const float* __restrict__ gnorm_in, bf16* __restrict__ grad_x,
                    bf16* __restrict__ grad_fx, float* __restrict__ grad_ws,
                    float* __restrict__ grad_bias, float* __restrict__ tau_acc,
                    int tiles_per_block) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int g = static_cast<int>(p.slices);
  const Plan pl = make_plan(D, g, W);
  Head hd{blockIdx.y / p.heads, blockIdx.y % p.heads, blockIdx.y, p.points, p.heads, D, g};
  bf16* ws = at<bf16>(smem, pl.ws);
  float* bias2 = at<float>(smem, pl.bias);
  float* gnorm = at<float>(smem, pl.gnorm);
  bf16* xs = at<bf16>(smem, pl.x);
  bf16* fxs = at<bf16>(smem, pl.y);
  bf16* gos = at<bf16>(smem, pl.go);
  bf16* oss = at<bf16>(smem, pl.z);
  bf16* gss = at<bf16>(smem, pl.z2);
  float* logits = at<float>(smem, pl.logits);
  float* dw = at<float>(smem, pl.dw);
  bf16* ps = at<bf16>(smem, pl.p);
  bf16* pgs = at<bf16>(smem, pl.pg);
  float* stage = at<float>(smem, pl.stage);
  const bf16* x = static_cast<const bf16*>(p.x);
  const int64_t mat = hd.bh * int64_t(g) * D;
  load_matrix<D, W>(ws, pl.ldk, static_cast<const bf16*>(p.ws), g);
  load_matrix<D, W>(oss, pl.ldk, os + mat, g);
  load_matrix<D, W>(gss, pl.ldk, gs + mat, g);
  for (int i = threadIdx.x; i < g; i += Cfg<W>::kThreads) gnorm[i] = gnorm_in[hd.bh * g + i];
  const float scale2 = load_bias2<W>(bias2, p, hd.h, g);
  const float inv_tau = 1.0f / p.tau[hd.h];

  PointSum<D, W> sums;  // grad_ws
  sums.zero();
  ColumnSum<W> bias_sum;
  float tau_sum = 0.0f;  // of (dL/dz) z2, z2 = z log2(e)
  const int64_t tiles = (p.points + kTile - 1) / kTile;
  const int64_t t0 = int64_t(blockIdx.x) * tiles_per_block;
  const int64_t t1 = imin(tiles, t0 + tiles_per_block);
  TileRows<D, W> x_next, fx_next, go_next;
  x_next.fetch(x, hd, t0 * kTile);
  fx_next.fetch(fx, hd, t0 * kTile);
  go_next.fetch(gout, hd, t0 * kTile);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n0 = t * kTile;
    x_next.store(xs, pl.ldk);
    fx_next.store(fxs, pl.ldk);
    go_next.store(gos, pl.ldk);
    __syncthreads();
    if (t + 1 < t1) {
      x_next.fetch(x, hd, n0 + kTile);
      fx_next.fetch(fx, hd, n0 + kTile);
      go_next.fetch(gout, hd, n0 + kTile);
    }
    gemm_nt<D, W>(xs, ws, nullptr, nullptr, pl.ldk, logits, pl.ldf, g);
    // dL/dw from the deslice (gout os^T) and from the slice sums (fx gs^T).
    gemm_nt<D, W>(gos, oss, fxs, gss, pl.ldk, dw, pl.ldf, g);
    __syncthreads();
    for_each_row<W>(logits, pl.ldf, bias2, scale2, g, hd, n0, p.lse, false,
                    [&](int r, float*, const float* z, const float* w, bool, int part) {
                      const float* drow = dw + r * pl.ldf;
                      float dl[Cfg<W>::kPerThread];
                      float dot = 0.0f;
#pragma unroll
                      for (int j = 0; j < Cfg<W>::kQuads; ++j) {
                        const int c = row_col<W>(part, 4 * j);
                        float4 d4 = make_float4(0.f, 0.f, 0.f, 0.f), n4 = d4;
                        if (c < g) {
                          d4 = *reinterpret_cast<const float4*>(drow + c);
                          n4 = *reinterpret_cast<const float4*>(gnorm + c);
                        }
                        dl[4 * j] = d4.x + n4.x;
                        dl[4 * j + 1] = d4.y + n4.y;
                        dl[4 * j + 2] = d4.z + n4.z;
                        dl[4 * j + 3] = d4.w + n4.w;
#pragma unroll
                        for (int e = 0; e < 4; ++e) dot += w[4 * j + e] * dl[4 * j + e];
                      }
                      dot = row_sum<Cfg<W>::kRowThreads>(dot);
#pragma unroll
                      for (int j = 0; j < Cfg<W>::kQuads; ++j) {
                        const int c = row_col<W>(part, 4 * j);
                        if (c >= g) break;
                        float gl[4];
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                          const float gz = w[4 * j + e] * (dl[4 * j + e] - dot);
                          tau_sum += gz * z[4 * j + e];
                          gl[e] = gz * inv_tau;  // dL/dlogits
                        }
                        store_bf16x4(ps + r * pl.ldg + c, w[4 * j], w[4 * j + 1], w[4 * j + 2],
                                     w[4 * j + 3]);
                        store_bf16x4(pgs + r * pl.ldg + c, gl[0], gl[1], gl[2], gl[3]);
                      }
                    });
    __syncthreads();
    bias_sum.add(pgs, pl.ldg, g);
    sums.add(pgs, pl.ldg, xs, pl.ldk, g);
    // grad_fx = w gs and grad_x = (dL/dlogits) ws, in one pass.
    gemm_nn_points<D, W>(
        ps, gss,
        [&](int r, int d, float4 v) {
          if (n0 + r < hd.n) store_bf16x4(grad_fx + hd.row(n0 + r) + d, v.x, v.y, v.z, v.w);
        },
        pgs, ws,
        [&](int r, int d, float4 v) {
          if (n0 + r < hd.n) store_bf16x4(grad_x + hd.row(n0 + r) + d, v.x, v.y, v.z, v.w);
        },
        pl.ldg, pl.ldk, g, stage);
  }
  sums.flush(grad_ws, g, stage);
  bias_sum.flush(grad_bias, g);
  tau_sum = warp_sum(tau_sum) * kLn2;
  if (threadIdx.x % 32 == 0) atomicAdd(tau_acc + hd.h, tau_sum);
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("slice kernels: ") + what +
                             " failed to launch: " + cudaGetErrorString(e));
  }
}

int sm_count() {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return sms > 0 ? sms : 1;
}

// One wave: at most as many blocks as fit on the device at once, each
// taking an equal run of tiles of its (batch, head).
template <typename Kernel>
dim3 launch_grid(Kernel kernel, int threads, size_t smem, const Problem& p, int* tiles_per_block,
                 int tile = kTile) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)) != cudaSuccess) {
    check_launch("cudaFuncSetAttribute");
  }
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
  if (per_sm < 1) per_sm = 1;
  const int64_t heads = p.batch * p.heads;
  const int64_t tiles = (p.points + tile - 1) / tile;
  // Rounded down: a block past the wave would double the kernel's time.
  int64_t chunks = int64_t(sm_count()) * per_sm / heads;
  chunks = std::max<int64_t>(1, std::min(chunks, tiles));
  const int64_t per = (tiles + chunks - 1) / chunks;
  *tiles_per_block = static_cast<int>(per);
  return dim3(static_cast<unsigned>((tiles + per - 1) / per), static_cast<unsigned>(heads));
}

void check_problem(const Problem& p) {
  if (!supported(p.dim, p.slices)) {
    throw std::invalid_argument("slice kernels: unsupported dim_head " + std::to_string(p.dim) +
                                " / slices " + std::to_string(p.slices));
  }
  if (p.batch * p.heads > 65535) throw std::invalid_argument("slice kernels: too many heads");
}

template <int D>
void reduce_d(const Problem& p, const void* y, float* acc, float* colsum, bool compute_lse) {
  if (p.points == 0) return;
  const int g = static_cast<int>(p.slices);
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const size_t smem = make_reg_plan(D, g, false).bytes;
  int per = 0;
  if (compute_lse) {
    const dim3 grid = launch_grid(lse_kernel<D>, kRegThreads, smem, p, &per, kRowTile);
    lse_kernel<D><<<grid, kRegThreads, smem, stream>>>(p, per);
    check_launch("lse");
  }
  // Every warp of a reduce block walks all of the block's tiles.
  const dim3 grid = launch_grid(reduce_kernel<D>, kRegThreads, smem, p, &per, kRowTile);
  reduce_kernel<D>
      <<<grid, kRegThreads, smem, stream>>>(p, static_cast<const bf16*>(y), acc, colsum, per);
  check_launch("reduce");
}

template <int D>
void expand_d(const Problem& p, const void* z, void* out) {
  if (p.points == 0) return;
  const size_t smem = make_reg_plan(D, static_cast<int>(p.slices), true).bytes;
  int per = 0;
  const dim3 grid = launch_grid(expand_kernel<D>, kRegThreads, smem, p, &per, kRowTile);
  expand_kernel<D><<<grid, kRegThreads, smem, static_cast<cudaStream_t>(p.stream)>>>(
      p, static_cast<const bf16*>(z), static_cast<bf16*>(out), per);
  check_launch("expand");
}

template <int D>
void backward_d(const Problem& p, const void* fx, const void* gout, const void* os, const void* gs,
                const float* gnorm, void* grad_x, void* grad_fx, float* grad_ws, float* grad_bias,
                float* tau_acc) {
  constexpr int threads = Cfg<kBackwardWarps>::kThreads;
  const size_t smem = make_plan(D, static_cast<int>(p.slices), kBackwardWarps).bytes;
  if (p.points == 0) return;
  int per = 0;
  const dim3 grid = launch_grid(backward_kernel<D>, threads, smem, p, &per);
  backward_kernel<D><<<grid, threads, smem, static_cast<cudaStream_t>(p.stream)>>>(
      p, static_cast<const bf16*>(fx), static_cast<const bf16*>(gout), static_cast<const bf16*>(os),
      static_cast<const bf16*>(gs), gnorm, static_cast<bf16*>(grad_x), static_cast<bf16*>(grad_fx),
      grad_ws, grad_bias, tau_acc, per);
  check_launch("backward");
}

}  // namespace

bool supported(int64_t dim, int64_t slices) {
  return (dim == 16 || dim == 32 || dim == 64) && slices >= 16 && slices <= kMaxSlices &&
         slices % 16 == 0;
}

void reduce(const Problem& p, const void* y, float* acc, float* colsum, bool compute_lse) {
  check_problem(p);
  switch (p.dim) {
    case 16:
      reduce_d<16>(p, y, acc, colsum, compute_lse);
      break;
    case 32:
      reduce_d<32>(p, y, acc, colsum, compute_lse);
      break;
    default:
      reduce_d<64>(p, y, acc, colsum, compute_lse);
      break;
  }
}

void expand(const Problem& p, const void* z, void* out) {
  check_problem(p);
  switch (p.dim) {
    case 16:
      expand_d<16>(p, z, out);
      break;
    case 32:
      expand_d<32>(p, z, out);
      break;
    default:
      expand_d<64>(p, z, out);
      break;
  }
}

void backward(const Problem& p, const void* fx, const void* gout, const void* os, const void* gs,
              const float* gnorm, void* grad_x, void* grad_fx, float* grad_ws, float* grad_bias,
              float* tau_acc) {
  check_problem(p);
  switch (p.dim) {
    case 16:
      backward_d<16>(p, fx, gout, os, gs, gnorm, grad_x, grad_fx, grad_ws, grad_bias, tau_acc);
      break;
    case 32:
      backward_d<32>(p, fx, gout, os, gs, gnorm, grad_x, grad_fx, grad_ws, grad_bias, tau_acc);
      break;
    default:
      backward_d<64>(p, fx, gout, os, gs, gnorm, grad_x, grad_fx, grad_ws, grad_bias, tau_acc);
      break;
  }
}

}  // namespace slipstream::aero::slice_kernels
