// The slice kernels of physics attention: see slice_kernels.h for the maths
// and layouts. One block of 16 warps owns one (batch, head) and a run of
// 32-point tiles. Per tile it loads the points' rows into shared memory,
// forms the 32 x G logits with tensor-core MMAs (WMMA, bf16 in, fp32
// accumulate), turns them into slice weights row by row (one warp per row),
// and then either reduces over the points (slice sums, held in registers
// across the block's tiles and added to global memory once), expands back to
// points, or runs the backward. The points x slices weights never leave
// shared memory.
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
constexpr int kForwardWarps = 8, kBackwardWarps = 16;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAt = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

enum class Kind { kReduce, kExpand, kBackward };

// Shared-memory layout, the same on host (for the launch size) and device.
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

__host__ __device__ inline Plan make_plan(Kind kind, int d, int g, int warps) {
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
  if (kind == Kind::kReduce) pl.y = take(off, rows);
  if (kind == Kind::kExpand) pl.z = take(off, mat);
  if (kind == Kind::kBackward) {
    pl.gnorm = take(off, g * sizeof(float));
    pl.y = take(off, rows);
    pl.go = take(off, rows);
    pl.z = take(off, mat);
    pl.z2 = take(off, mat);
    pl.dw = take(off, f32);
  }
  pl.logits = take(off, f32);
  pl.p = take(off, size_t(kTile) * pl.ldg * sizeof(bf16));
  if (kind == Kind::kBackward) pl.pg = take(off, size_t(kTile) * pl.ldg * sizeof(bf16));
  // Partial 16 x 16 output tiles of the point products (two products of
  // (kTile/16) x (D/16) tiles in the backward), at least one per warp.
  const int out_tiles = (kind == Kind::kBackward ? 2 : 1) * (kTile / 16) * (d / 16);
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
  for (int i = threadIdx.x; i < rows * kPieces; i += Cfg<W>::kThreads) {
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
// elements (d a multiple of 4) of product i. Syncs the block first (so A and B written by other threads are
// seen), between, and after (so the stage and the inputs may be reused).
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
__device__ inline void for_each_row(float* logits, int ldf, const float* bias2, float scale2,
                                    int g, const Head& hd, int64_t n0, float* lse,
                                    bool compute_lse, Body body) {
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
  for (int i = threadIdx.x; i < g; i += Cfg<W>::kThreads) bias2[i] = p.bias[i] * scale2;
  return scale2;
}

template <int D, int W = kForwardWarps>
__global__ void __launch_bounds__(Cfg<W>::kThreads, 2)
    reduce_kernel(Problem p, const bf16* __restrict__ y, float* __restrict__ acc_out,
                  float* __restrict__ colsum_out, bool compute_lse, int tiles_per_block) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int g = static_cast<int>(p.slices);
  const Plan pl = make_plan(Kind::kReduce, D, g, W);
  Head hd{blockIdx.y / p.heads, blockIdx.y % p.heads, blockIdx.y, p.points, p.heads, D, g};
  bf16* ws = at<bf16>(smem, pl.ws);
  float* bias2 = at<float>(smem, pl.bias);
  bf16* xs = at<bf16>(smem, pl.x);
  bf16* ys = at<bf16>(smem, pl.y);
  float* logits = at<float>(smem, pl.logits);
  bf16* ps = at<bf16>(smem, pl.p);
  float* stage = at<float>(smem, pl.stage);
  const bf16* x = static_cast<const bf16*>(p.x);
  load_matrix<D, W>(ws, pl.ldk, static_cast<const bf16*>(p.ws), g);
  const float scale2 = load_bias2<W>(bias2, p, hd.h, g);

  PointSum<D, W> sums;
  sums.zero();
  ColumnSum<W> colsum;
  const int64_t tiles = (p.points + kTile - 1) / kTile;
  const int64_t t0 = int64_t(blockIdx.x) * tiles_per_block;
  const int64_t t1 = imin(tiles, t0 + tiles_per_block);
  TileRows<D, W> x_next, y_next;
  x_next.fetch(x, hd, t0 * kTile);
  y_next.fetch(y, hd, t0 * kTile);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n0 = t * kTile;
    x_next.store(xs, pl.ldk);
    y_next.store(ys, pl.ldk);
    __syncthreads();
    if (t + 1 < t1) {
      x_next.fetch(x, hd, n0 + kTile);
      y_next.fetch(y, hd, n0 + kTile);
    }
    gemm_nt<D, W>(xs, ws, nullptr, nullptr, pl.ldk, logits, pl.ldf, g);
    __syncthreads();
    for_each_row<W>(logits, pl.ldf, bias2, scale2, g, hd, n0, p.lse, compute_lse,
                    [&](int r, float*, const float*, const float* w, bool, int part) {
#pragma unroll
                      for (int j = 0; j < Cfg<W>::kQuads; ++j) {
                        const int c = row_col<W>(part, 4 * j);
                        if (c >= g) break;
                        const float* q = w + 4 * j;
                        store_bf16x4(ps + r * pl.ldg + c, q[0], q[1], q[2], q[3]);
                      }
                    });
    __syncthreads();
    if (colsum_out != nullptr) colsum.add(ps, pl.ldg, g);
    sums.add(ps, pl.ldg, ys, pl.ldk, g);
    __syncthreads();
  }
  sums.flush(acc_out + hd.bh * int64_t(g) * D, g, stage);
  if (colsum_out != nullptr) colsum.flush(colsum_out + hd.bh * g, g);
}

template <int D, int W = kForwardWarps>
__global__ void __launch_bounds__(Cfg<W>::kThreads, 2)
    expand_kernel(Problem p, const bf16* __restrict__ z_in, bf16* __restrict__ out,
                  int tiles_per_block) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int g = static_cast<int>(p.slices);
  const Plan pl = make_plan(Kind::kExpand, D, g, W);
  Head hd{blockIdx.y / p.heads, blockIdx.y % p.heads, blockIdx.y, p.points, p.heads, D, g};
  bf16* ws = at<bf16>(smem, pl.ws);
  float* bias2 = at<float>(smem, pl.bias);
  bf16* xs = at<bf16>(smem, pl.x);
  bf16* zs = at<bf16>(smem, pl.z);
  float* logits = at<float>(smem, pl.logits);
  bf16* ps = at<bf16>(smem, pl.p);
  float* stage = at<float>(smem, pl.stage);
  const bf16* x = static_cast<const bf16*>(p.x);
  load_matrix<D, W>(ws, pl.ldk, static_cast<const bf16*>(p.ws), g);
  load_matrix<D, W>(zs, pl.ldk, z_in + hd.bh * int64_t(g) * D, g);
  const float scale2 = load_bias2<W>(bias2, p, hd.h, g);

  const int64_t tiles = (p.points + kTile - 1) / kTile;
  const int64_t t0 = int64_t(blockIdx.x) * tiles_per_block;
  const int64_t t1 = imin(tiles, t0 + tiles_per_block);
  TileRows<D, W> x_next;
  x_next.fetch(x, hd, t0 * kTile);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n0 = t * kTile;
    x_next.store(xs, pl.ldk);
    __syncthreads();
    if (t + 1 < t1) x_next.fetch(x, hd, n0 + kTile);
    gemm_nt<D, W>(xs, ws, nullptr, nullptr, pl.ldk, logits, pl.ldf, g);
    __syncthreads();
    for_each_row<W>(logits, pl.ldf, bias2, scale2, g, hd, n0, p.lse, false,
                    [&](int r, float*, const float*, const float* w, bool, int part) {
#pragma unroll
                      for (int j = 0; j < Cfg<W>::kQuads; ++j) {
                        const int c = row_col<W>(part, 4 * j);
                        if (c >= g) break;
                        const float* q = w + 4 * j;
                        store_bf16x4(ps + r * pl.ldg + c, q[0], q[1], q[2], q[3]);
                      }
                    });
    const auto emit = [&](int r, int d, float4 v) {
      if (n0 + r < hd.n) store_bf16x4(out + hd.row(n0 + r) + d, v.x, v.y, v.z, v.w);
    };
    gemm_nn_points<D, W>(ps, zs, emit, nullptr, nullptr, emit, pl.ldg, pl.ldk, g, stage);
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
  const Plan pl = make_plan(Kind::kBackward, D, g, W);
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
    for_each_row<W>(
        logits, pl.ldf, bias2, scale2, g, hd, n0, p.lse, false,
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
            store_bf16x4(ps + r * pl.ldg + c, w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]);
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
dim3 launch_grid(Kernel kernel, int threads, size_t smem, const Problem& p, int* tiles_per_block) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)) != cudaSuccess) {
    check_launch("cudaFuncSetAttribute");
  }
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
  if (per_sm < 1) per_sm = 1;
  const int64_t heads = p.batch * p.heads;
  const int64_t tiles = (p.points + kTile - 1) / kTile;
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
  constexpr int threads = Cfg<kForwardWarps>::kThreads;
  const size_t smem = make_plan(Kind::kReduce, D, static_cast<int>(p.slices), kForwardWarps).bytes;
  if (p.points == 0) return;
  int per = 0;
  const dim3 grid = launch_grid(reduce_kernel<D>, threads, smem, p, &per);
  reduce_kernel<D><<<grid, threads, smem, static_cast<cudaStream_t>(p.stream)>>>(
      p, static_cast<const bf16*>(y), acc, colsum, compute_lse, per);
  check_launch("reduce");
}

template <int D>
void expand_d(const Problem& p, const void* z, void* out) {
  constexpr int threads = Cfg<kForwardWarps>::kThreads;
  const size_t smem = make_plan(Kind::kExpand, D, static_cast<int>(p.slices), kForwardWarps).bytes;
  if (p.points == 0) return;
  int per = 0;
  const dim3 grid = launch_grid(expand_kernel<D>, threads, smem, p, &per);
  expand_kernel<D><<<grid, threads, smem, static_cast<cudaStream_t>(p.stream)>>>(
      p, static_cast<const bf16*>(z), static_cast<bf16*>(out), per);
  check_launch("expand");
}

template <int D>
void backward_d(const Problem& p, const void* fx, const void* gout, const void* os, const void* gs,
                const float* gnorm, void* grad_x, void* grad_fx, float* grad_ws, float* grad_bias,
                float* tau_acc) {
  constexpr int threads = Cfg<kBackwardWarps>::kThreads;
  const size_t smem =
      make_plan(Kind::kBackward, D, static_cast<int>(p.slices), kBackwardWarps).bytes;
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
