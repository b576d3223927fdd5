// The slice kernels' common pieces (slice_kernels.h has the maths): the
// per-block (batch, head) and tile ranges, shared-memory plans, the
// mma.sync fragments of row tiles and the point tile that every row-owning
// kernel walks, and the backward's fragment helpers.
#pragma once

#include "aero/kernels/common/ptx.cuh"
#include "aero/kernels/slice/slice_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace slipstream::aero::slice_kernels::detail {

using kernels::bf16;
using kernels::cp_async16;
using kernels::cp_async4;
using kernels::cp_async_commit;
using kernels::cp_async_wait;
using kernels::exp2_approx;
using kernels::ldmatrix_x2;
using kernels::ldmatrix_x2_trans;
using kernels::ldmatrix_x4;
using kernels::ldmatrix_x4_trans;
using kernels::load_u32;
using kernels::mma_16816;
using kernels::mma_1688;
using kernels::pack_bf16;
using kernels::stmatrix_x2;
using kernels::stmatrix_x4;
using kernels::transpose8;
using kernels::warp_sum;

constexpr int kMaxSlices = 256;
constexpr int kRowTile = 16;  // points per warp tile

// Shared-memory carving: 128-byte aligned pieces, the same on host (for the
// launch size) and device.
__host__ __device__ inline size_t take(size_t& off, size_t n) {
  const size_t at = (off + 127) / 128 * 128;
  off = at + n;
  return at;
}

template <typename T>
__device__ inline T* at(unsigned char* smem, size_t off) {
  return reinterpret_cast<T*>(smem + off);
}

__device__ inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// The logits are kept in log2 units, z2 = z log2(e), so that each weight
// is one ex2 (the lse stays in natural units in global memory).
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// The per-(batch, head) context of a block.
struct Head {
  int64_t b, h, bh, n, heads;
  int d, g;
  // Element offset of point n's row for this head in a (B, N, H, D) tensor.
  __device__ int64_t row(int64_t point) const { return ((b * n + point) * heads + h) * d; }
};

// The (batch, head) of this block (blockIdx.y).
__device__ inline Head block_head(const Problem& p, int d, int g) {
  return {blockIdx.y / p.heads, blockIdx.y % p.heads, blockIdx.y, p.points, p.heads, d, g};
}

struct TileRange {
  int64_t t0, t1;
};

// This block's run [t0, t1) of `size`-point tiles (blockIdx.x): 16-point
// warp tiles or 64-point pipeline stages.
__device__ inline TileRange block_tiles(const Problem& p, int tiles_per_block, int size) {
  const int64_t tiles = (p.points + size - 1) / size;
  const int64_t t0 = int64_t(blockIdx.x) * tiles_per_block;
  return {t0, imin(tiles, t0 + tiles_per_block)};
}

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

// A (G, D) matrix, contiguous, into shared memory with pitch ldk.
template <int D, int W>
__device__ inline void load_matrix(bf16* dst, int ldk, const bf16* src, int g) {
  load_rows<D, W>(dst, ldk, src, g, g, [](int r) { return int64_t(r) * D; });
}

// Shared-memory bias2 = bias log2(e) / tau; returns scale2 = log2(e) / tau.
template <int W>
__device__ inline float load_bias2(float* bias2, const Problem& p, int h, int g) {
  const float scale2 = kLog2e / p.tau[h];
  for (int i = threadIdx.x; i < g; i += 32 * W) bias2[i] = p.bias[i] * scale2;
  return scale2;
}

// Head sizes are multiples of 8. Products with k = D run in steps of 16;
// when D % 16 == 8 the last step is 8 wide (half_step). Products with n = D
// run over D / 8 tiles of 8.
__host__ __device__ constexpr int ksteps(int d) { return (d + 15) / 16; }

template <int D>
__device__ inline constexpr bool half_step(int k) {
  return D % 16 == 8 && k == D / 16;
}

// c += a b over step k of D (a: an A fragment, b0, b1: the B fragment).
template <int D>
__device__ inline void mma_k(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                             int k) {
  if (half_step<D>(k)) {
    mma_1688(c, a[0], a[1], b0);
  } else {
    mma_16816(c, a, b0, b1);
  }
}

// The pitch (in bf16) of a shared-memory matrix with rows of D: an odd
// number of 16-byte pieces, so that the eight rows of an ldmatrix land on
// distinct banks.
__host__ __device__ constexpr int row_pitch(int d) { return (d / 8) % 2 == 1 ? d : d + 8; }

// Two B fragments pairs from a row-major matrix in shared memory, rows the
// n index: r[0], r[1] are the fragment (k = col0 .. col0 + 15, n = row0 ..
// row0 + 7), r[2], r[3] the one for n = row0 + 8 .. row0 + 15.
__device__ inline void b_frags_x4(uint32_t (&r)[4], const bf16* m, int ld, int row0, int col0,
                                  int lane) {
  ldmatrix_x4(r, m + (row0 + 8 * (lane / 16) + lane % 8) * ld + col0 + 8 * (lane / 8 % 2));
}

// The same for an 8-wide k step (cols col0 .. col0 + 7 only): r[0] for n =
// row0 .. row0 + 7, r[2] for the next 8 rows; r[1], r[3] zero.
__device__ inline void b_frags_half(uint32_t (&r)[4], const bf16* m, int ld, int row0, int col0,
                                    int lane) {
  uint32_t t[2];
  ldmatrix_x2(t, m + (row0 + 8 * (lane / 8 % 2) + lane % 8) * ld + col0);
  r[0] = t[0];
  r[1] = 0u;
  r[2] = t[1];
  r[3] = 0u;
}

// Step k of D (cols 16 k ..) of rows row0 .. row0 + 15 as B fragments.
template <int D>
__device__ inline void b_frags_k(uint32_t (&r)[4], const bf16* m, int ld, int row0, int k,
                                 int lane) {
  if (half_step<D>(k)) {
    b_frags_half(r, m, ld, row0, 16 * k, lane);
  } else {
    b_frags_x4(r, m, ld, row0, 16 * k, lane);
  }
}

constexpr int kRegWarps = 8;
constexpr int kRegThreads = kRegWarps * 32;

// Shared memory of the register kernels: ws (G x D, pitch row_pitch(D)),
// bias2 (G) and, for expand, z transposed (D x G, pitch G + 8). The pitches
// put the 32 lanes of each fragment load on 32 different banks.
struct RegPlan {
  int ldk, ldg;
  size_t ws, bias, zt, bytes;
};

__host__ __device__ inline RegPlan make_reg_plan(int d, int g, bool with_z) {
  RegPlan pl{};
  pl.ldk = row_pitch(d);
  pl.ldg = g + 8;
  size_t off = 0;
  pl.ws = take(off, size_t(g) * pl.ldk * sizeof(bf16));
  pl.bias = take(off, g * sizeof(float));
  if (with_z) pl.zt = take(off, size_t(d) * pl.ldg * sizeof(bf16));
  pl.bytes = off;
  return pl;
}

// A warp's view of one 16-point tile: rows a = lane/4 and b = a + 8.
// Rows na and nb = na + 8 (lane/4 and lane/4 + 8 of a 16-point tile) of a
// (B, N, H, D) tensor as A fragments (k = D); zero for rows past the end
// and for the missing half of a half step.
template <int D>
__device__ inline void read_a_frags(const bf16* base, const Head& hd, int64_t na, int64_t nb,
                                    bool va, bool vb, int c0, uint32_t (&a)[ksteps(D)][4]) {
  const bf16* ra = base + hd.row(va ? na : 0);
  const bf16* rb = base + hd.row(vb ? nb : 0);
#pragma unroll
  for (int k = 0; k < ksteps(D); ++k) {
    const bool whole = !half_step<D>(k);
    a[k][0] = va ? load_u32(ra + 16 * k + c0) : 0u;
    a[k][1] = vb ? load_u32(rb + 16 * k + c0) : 0u;
    a[k][2] = va && whole ? load_u32(ra + 16 * k + c0 + 8) : 0u;
    a[k][3] = vb && whole ? load_u32(rb + 16 * k + c0 + 8) : 0u;
  }
}

// A warp's staging buffer for store_staged: 16 rows of 16 ksteps(D) + 8
// bf16 (the 16 bytes past a row's products turn its 8 rows of each
// stmatrix to 8 different bank groups).
__host__ __device__ constexpr int stage_pitch(int d) { return 16 * ksteps(d) + 8; }
__host__ __device__ constexpr size_t stage_bytes(int d) {
  return size_t(16) * stage_pitch(d) * sizeof(__nv_bfloat16);
}

// A 16-point tile's A fragments (k = D, as read_a_frags gives them) from
// its rows in a staging buffer (stage_pitch(D)), with ldmatrix.
template <int D>
__device__ inline void frags_from_stage(const bf16* stage, int lane, uint32_t (&a)[ksteps(D)][4]) {
  const bf16* row = stage + (lane % 16) * stage_pitch(D) + 8 * (lane / 16);
#pragma unroll
  for (int k = 0; k < ksteps(D); ++k) {
    if (half_step<D>(k)) {
      uint32_t t[2];
      ldmatrix_x2(t, row + 16 * k);  // lanes 0 .. 15: rows a, b of columns 16 k ..
      a[k][0] = t[0];
      a[k][1] = t[1];
      a[k][2] = a[k][3] = 0u;
    } else {
      ldmatrix_x4(a[k], row + 16 * k);
    }
  }
}

template <int D>
struct PointTile {
  int64_t na, nb;
  bool va, vb;
  uint32_t x[ksteps(D)][4];  // the tile's x rows as A fragments (k = D)
  float la, lb;              // the rows' lse (read when asked)

  __device__ PointTile(const Problem& p, const Head& hd, int64_t t, int lane, bool read_lse) {
    const int r0 = lane / 4, c0 = 2 * (lane % 4);
    na = t * kRowTile + r0;
    nb = na + 8;
    va = na < hd.n;
    vb = nb < hd.n;
    read_a_frags<D>(static_cast<const bf16*>(p.x), hd, na, nb, va, vb, c0, x);
    // Nothing here uses a loaded value: a tile can be read a step ahead.
    la = read_lse && va ? p.lse[hd.bh * hd.n + na] : 0.0f;
    lb = read_lse && vb ? p.lse[hd.bh * hd.n + nb] : 0.0f;
  }
  // The same with x's rows already in a staging buffer (stage_rows).
  __device__ PointTile(const Problem& p, const Head& hd, int64_t t, int lane, bool read_lse,
                       const bf16* staged_x) {
    na = t * kRowTile + lane / 4;
    nb = na + 8;
    va = na < hd.n;
    vb = nb < hd.n;
    frags_from_stage<D>(staged_x, lane, x);
    la = read_lse && va ? p.lse[hd.bh * hd.n + na] : 0.0f;
    lb = read_lse && vb ? p.lse[hd.bh * hd.n + nb] : 0.0f;
  }

  // z2 (log2-unit logits) of slices s0 + 8 j + {c0, c0 + 1} for rows a, b:
  // z[j][0..1] row a, z[j][2..3] row b.
  __device__ void logits(const bf16* ws, int ldk, const float* bias2, float scale2, int s0,
                         int lane, float (&z)[2][4]) const {
    const int c0 = 2 * (lane % 4);
    uint32_t b[ksteps(D)][4];
#pragma unroll
    for (int k = 0; k < ksteps(D); ++k) b_frags_k<D>(b[k], ws, ldk, s0, k, lane);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int k = 0; k < ksteps(D); ++k) mma_k<D>(c, x[k], b[k][2 * j], b[k][2 * j + 1], k);
      const float b0 = bias2[s0 + 8 * j + c0], b1 = bias2[s0 + 8 * j + c0 + 1];
      z[j][0] = fmaf(c[0], scale2, b0);
      z[j][1] = fmaf(c[1], scale2, b1);
      z[j][2] = fmaf(c[2], scale2, b0);
      z[j][3] = fmaf(c[3], scale2, b1);
    }
  }

  // Writes a 16 x D accumulator (C fragments, 8-wide tiles of D) to the
  // tile's rows a and b of a (B, N, H, D) bf16 tensor, rows past the end left.
  __device__ void store(bf16* out, const Head& hd, int lane, const float (&acc)[D / 8][4]) const {
    const int c0 = 2 * (lane % 4);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      const int d = 8 * dt + c0;
      if (va)
        *reinterpret_cast<uint32_t*>(out + hd.row(na) + d) = pack_bf16(acc[dt][0], acc[dt][1]);
      if (vb)
        *reinterpret_cast<uint32_t*>(out + hd.row(nb) + d) = pack_bf16(acc[dt][2], acc[dt][3]);
    }
  }

  // The same through this warp's staging buffer in shared memory (sm_90,
  // stage_bytes(D)): the fragments go in with stmatrix, and each lane then
  // writes whole 16-byte pieces of rows, where store() takes D / 4 stores
  // of 4 bytes a lane, each half a sector. Every lane of the warp calls it.
  __device__ void store_staged(bf16* out, const Head& hd, int lane, const float (&acc)[D / 8][4],
                               bf16* stage) const {
    constexpr int T = D / 8, SP = stage_pitch(D);
    uint32_t wa[T], wb[T];
#pragma unroll
    for (int dt = 0; dt < T; ++dt) {
      wa[dt] = pack_bf16(acc[dt][0], acc[dt][1]);
      wb[dt] = pack_bf16(acc[dt][2], acc[dt][3]);
    }
    // Lane l names row l % 8 of matrix l / 8: rows a (even matrices) or b
    // (odd) of column tiles dt (first pair) and dt + 1 (second pair).
    const int mi = lane / 8;
    bf16* const row = stage + ((mi & 1) * 8 + lane % 8) * SP + 8 * (mi / 2);
#pragma unroll
    for (int dt = 0; dt + 1 < T; dt += 2)
      stmatrix_x4(row + 8 * dt, wa[dt], wb[dt], wa[dt + 1], wb[dt + 1]);
    if constexpr (T % 2 == 1) stmatrix_x2(row + 8 * (T - 1), wa[T - 1], wb[T - 1]);
    __syncwarp();
    const int64_t n0 = na - lane / 4;
#pragma unroll
    for (int i0 = 0; i0 < 16 * T; i0 += 32) {
      const int i = i0 + lane;
      if (16 * T % 32 != 0 && i >= 16 * T) break;
      const int r = i / T, piece = i % T;
      const uint4 v = *reinterpret_cast<const uint4*>(stage + r * SP + 8 * piece);
      if (n0 + r < hd.n) *reinterpret_cast<uint4*>(out + hd.row(n0 + r) + 8 * piece) = v;
    }
    __syncwarp();
  }

  // Sums the per-lane parts v[0] (row a), v[1] (row b) over the four lanes
  // of each row and writes them to rows a, b of a (B, H, N) fp32 tensor.
  __device__ void store_row_sums(float* out, const Head& hd, int lane, float (&v)[2]) const {
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // the four lanes of a row hold its columns
      v[r] += __shfl_xor_sync(0xffffffffu, v[r], 1);
      v[r] += __shfl_xor_sync(0xffffffffu, v[r], 2);
    }
    if (lane % 4 == 0) {
      if (va) out[hd.bh * hd.n + na] = v[0];
      if (vb) out[hd.bh * hd.n + nb] = v[1];
    }
  }

  // Merges the per-lane online log-sum-exps (m[r], sum[r]: log2 units) over
  // the four lanes of each row and writes lse (natural units) to rows a, b.
  __device__ void store_lse(float* lse, const Head& hd, int lane, float (&m)[2],
                            float (&sum)[2]) const {
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // the four lanes of a row hold its columns
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
      if (va) lse[hd.bh * hd.n + na] = (m[0] + __log2f(sum[0])) * kLn2;
      if (vb) lse[hd.bh * hd.n + nb] = (m[1] + __log2f(sum[1])) * kLn2;
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

// A row-ownership forward block's shared memory once set up.
struct RegBlock {
  const bf16* ws;      // G x D, pitch ldk
  const bf16* zt;      // D x G, pitch ldg (expand only)
  const float* bias2;  // bias log2(e) / tau
  float scale2;        // log2(e) / tau
};

// ws and bias2 into shared memory (and z transposed when given); syncs.
template <int D>
__device__ inline RegBlock reg_setup(const RegPlan& pl, unsigned char* smem, const Problem& p,
                                     const Head& hd, const bf16* z) {
  load_matrix<D, kRegWarps>(at<bf16>(smem, pl.ws), pl.ldk, static_cast<const bf16*>(p.ws), hd.g);
  if (z != nullptr) {
    bf16* zt = at<bf16>(smem, pl.zt);
    for (int i = threadIdx.x; i < hd.g * D; i += kRegThreads) zt[(i % D) * pl.ldg + i / D] = z[i];
  }
  const float scale2 = load_bias2<kRegWarps>(at<float>(smem, pl.bias), p, hd.h, hd.g);
  __syncthreads();
  return {at<bf16>(smem, pl.ws), z != nullptr ? at<bf16>(smem, pl.zt) : nullptr,
          at<float>(smem, pl.bias), scale2};
}

// B fragments (k = the 16 slices from s0, n = D in 8-wide tiles) of a
// (G x D) matrix in shared memory with pitch ldk: b[dt][0..1].
template <int D>
__device__ inline void slice_b_frags(const bf16* m, int ldk, int s0, int lane,
                                     uint32_t (&b)[D / 8][2]) {
  const int blk = lane / 8, i = lane % 8;
#pragma unroll
  for (int dt = 0; dt < D / 8; dt += 2) {
    if (dt + 1 < D / 8) {
      uint32_t r[4];
      ldmatrix_x4_trans(r, m + (s0 + 8 * (blk % 2) + i) * ldk + 8 * (dt + blk / 2));
      b[dt][0] = r[0];
      b[dt][1] = r[1];
      b[dt + 1][0] = r[2];
      b[dt + 1][1] = r[3];
    } else {  // an odd number of 8-wide tiles: lanes 0 - 15 address the last
      uint32_t r[2];
      ldmatrix_x2_trans(r, m + (s0 + 8 * (blk % 2) + i) * ldk + 8 * dt);
      b[dt][0] = r[0];
      b[dt][1] = r[1];
    }
  }
}

constexpr int kBackWarps = 8;
constexpr int kBackThreads = kBackWarps * 32;

// ws, os, gs (G x D bf16, pitch row_pitch(D)), bias2 and gnorm.
struct BackPlan {
  int ldk;
  size_t ws, os, gs, bias, gnorm, bytes;
};

__host__ __device__ inline BackPlan make_back_plan(int d, int g) {
  BackPlan pl{};
  pl.ldk = row_pitch(d);
  size_t off = 0;
  const size_t mat = size_t(g) * pl.ldk * sizeof(bf16);
  pl.ws = take(off, mat);
  pl.os = take(off, mat);
  pl.gs = take(off, mat);
  pl.bias = take(off, g * sizeof(float));
  pl.gnorm = take(off, g * sizeof(float));
  pl.bytes = off;
  return pl;
}

// The four A-fragment registers of a 16 x 16 block given as [j][0..3] (j
// the 8-wide column tile; 0..1 row a, 2..3 row b), packed to bf16.
__device__ inline void pack_a(const float (&v)[2][4], uint32_t (&a)[4]) {
  a[0] = pack_bf16(v[0][0], v[0][1]);
  a[1] = pack_bf16(v[0][2], v[0][3]);
  a[2] = pack_bf16(v[1][0], v[1][1]);
  a[3] = pack_bf16(v[1][2], v[1][3]);
}

// acc (16 points x D, C fragments) += v (16 points x the 16 slices from
// s0, as [j][0..3]) m[s0 .. s0 + 15, :], m a (G x D) matrix in shared memory.
template <int D>
__device__ inline void add_points_slices(float (&acc)[D / 8][4], const float (&v)[2][4],
                                         const bf16* m, int ldk, int s0, int lane) {
  uint32_t a[4], b[D / 8][2];
  pack_a(v, a);
  slice_b_frags<D>(m, ldk, s0, lane, b);
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) mma_16816(acc[dt], a, b[dt][0], b[dt][1]);
}
}  // namespace slipstream::aero::slice_kernels::detail
