// The slice kernels of physics attention: see slice_kernels.h for the maths
// and layouts. Every kernel owns one (batch, head) per block and a run of
// points, and recomputes the points x slices weights from x instead of
// reading them; they never reach global memory. All of them keep the
// weights in registers: tensor-core products whose accumulators are turned
// into weights in place and fed back as the next product's operand.
// Two shapes of work:
//   row ownership (lse, expand, backward): a warp owns 16-point tiles and
//     runs every chunk of 16 slices on them, reading its own rows;
//   column ownership (reduce, weight_grad): a warp owns chunks of slices
//     and sums over all the block's points, which the block reads once into
//     a cp.async pipeline of 64-point stages in shared memory.
// See "the forward kernels", "reduce" and "the backward kernels" below:
// mma.sync m16n8k16, which every GPU since Ampere has. On Hopper the row
// kernels have wgmma forms ("on Hopper" below): four warps' tiles share
// each B operand, read once from shared memory.
#include "aero/model/kernels/launch.h"
#include "aero/model/kernels/slice_kernels.h"
#include "aero/model/kernels/wgmma.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace slipstream::aero::slice_kernels {
namespace {

using bf16 = __nv_bfloat16;

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
//   reduce: column ownership (below); the weights, transposed with
//           movmatrix, are the A operand of (slices x points) (points x D).
//   expand: each warp owns its tiles; the weights are the A operand of
//           (points x slices) (slices x D), chunk by chunk.

__device__ inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The last 8 of D when D % 16 == 8 (D = 56): an m16n8k8 product, whose A
// fragment is the first two registers of the m16n8k16 one and whose B
// fragment is its first register.
__device__ inline void mma_1688(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(b0));
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

__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ inline void ldmatrix_x2(uint32_t (&r)[2], const bf16* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(a));
}

__device__ inline void ldmatrix_x2_trans(uint32_t (&r)[2], const bf16* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(a));
}

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

// stmatrix (sm_90): 8 x 8 bf16 matrices from registers in mma's fragment
// layout (lane 4 r + q: row r, columns 2 q, 2 q + 1) into shared memory,
// lanes 8 i .. 8 i + 7 naming the rows of matrix i (x4: four matrices,
// x2: two, named by lanes 0 .. 15).
__device__ inline void stmatrix_x4(const void* row, uint32_t r0, uint32_t r1, uint32_t r2,
                                   uint32_t r3) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  SLIPSTREAM_WGMMA_ASM(
      "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(r0),
      "r"(r1), "r"(r2), "r"(r3)
      : "memory");
}
__device__ inline void stmatrix_x2(const void* row, uint32_t r0, uint32_t r1) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  SLIPSTREAM_WGMMA_ASM("stmatrix.sync.aligned.m8n8.x2.shared.b16 [%0], {%1, %2};\n" ::"r"(a),
                       "r"(r0), "r"(r1)
                       : "memory");
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

template <int D>
__global__ void __launch_bounds__(kRegThreads) lse_kernel(Problem p, int tiles_per_block) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int g = static_cast<int>(p.slices);
  const RegPlan pl = make_reg_plan(D, g, false);
  const Head hd = block_head(p, D, g);
  const RegBlock rb = reg_setup<D>(pl, smem, p, hd, nullptr);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const auto [t0, t1] = block_tiles(p, tiles_per_block, kRowTile);
  for (int64_t t = t0 + warp; t < t1; t += kRegWarps) {
    const PointTile<D> tile(p, hd, t, lane, false);
    float m[2] = {-INFINITY, -INFINITY}, sum[2] = {0.f, 0.f};  // rows a, b
    for (int s0 = 0; s0 < g; s0 += 16) {
      float z[2][4];
      tile.logits(rb.ws, pl.ldk, rb.bias2, rb.scale2, s0, lane, z);
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
    tile.store_lse(p.lse, hd, lane, m, sum);
  }
}

// ---- reduce: a block-wide pipeline of 64-point stages ----
//
// Each warp owns some chunks of 16 slices (q = warp + i W) for the whole
// launch and keeps their ws fragments and bias in registers. The block
// reads x, y and lse of 64 points at a time into shared memory with
// cp.async, kStages stages in flight, so that every point is read from
// global memory once per block rather than once per warp; each warp then
// takes its fragments from there with ldmatrix (x as A, y transposed as B).
constexpr int kStagePoints = 64;
constexpr int kStages = 4;

// 16 bytes global -> shared, zero-filled when !valid (src is then not read).
__device__ inline void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ inline void cp_async4(void* dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Starts copying a 16-point tile's rows (points n0 .. n0 + 15, zeros past
// the end) of a (B, N, H, D) bf16 tensor into this warp's staging buffer
// (stage_pitch(D)) in 16-byte pieces, for frags_from_stage once this
// lane's cp.async group has landed and the warp has synchronized.
template <int D>
__device__ inline void stage_rows(bf16* stage, const bf16* base, const Head& hd, int64_t n0,
                                  int lane) {
  constexpr int T = D / 8;
#pragma unroll
  for (int i0 = 0; i0 < 16 * T; i0 += 32) {
    const int i = i0 + lane;
    if (16 * T % 32 != 0 && i >= 16 * T) break;
    const int r = i / T, piece = i % T;
    const bool valid = n0 + r < hd.n;
    cp_async16(stage + r * stage_pitch(D) + 8 * piece,
               base + hd.row(valid ? n0 + r : 0) + 8 * piece, valid);
  }
}

// One pipeline stage of 64 points: T (B, N, H, D) bf16 tensors (64 rows of
// D each, pitch row_pitch(D): the eight 16-byte rows of an ldmatrix land on
// distinct banks) and S (B, H, N) fp32 per-point values.
template <int T, int S>
struct Stage {
  int ldx;
  size_t mat[T], vec[S], bytes;  // offsets in the stage; its size (128-aligned)
};

// pitch: the row pitch in bf16, 0 for row_pitch(d); a tiled stage
// (wgmma.cuh, for the wgmma kernels) passes its padded width.
template <int T, int S>
__host__ __device__ inline Stage<T, S> make_stage(int d, int pitch = 0) {
  Stage<T, S> st{};
  st.ldx = pitch > 0 ? pitch : row_pitch(d);
  size_t off = 0;
  for (int i = 0; i < T; ++i) st.mat[i] = take(off, size_t(kStagePoints) * st.ldx * sizeof(bf16));
  for (int i = 0; i < S; ++i) st.vec[i] = take(off, kStagePoints * sizeof(float));
  st.bytes = (off + 127) / 128 * 128;
  return st;
}

// The inputs of a stage: where its tensors and per-point values come from,
// and the value a per-point array takes past the last point (the tensors
// read as zero there).
template <int T, int S>
struct StageSources {
  const bf16* mat[T];
  const float* vec[S];
  float pad[S];
};

// The block-wide pipeline over stages [s0, s1): kStages - 1 stages are
// read ahead with cp.async while consume(stage pointer) works on the
// current one; one barrier per stage. kTiledDP > 0: the stage's matrices
// are tiled with kTiledDP columns (those past D zero) and made visible to
// wgmma's reads (the async proxy) before the barrier.
template <int D, int T, int S, int kTiledDP = 0, typename Consume>
__device__ inline void run_stages(const Stage<T, S>& st, const StageSources<T, S>& src,
                                  unsigned char* smem, const Head& hd, int64_t s0, int64_t s1,
                                  Consume consume) {
  const auto issue = [&](int64_t s) {
    unsigned char* buf = smem + ((s - s0) % kStages) * st.bytes;
    const int64_t n0 = s * kStagePoints;
    constexpr int kPieces = (kTiledDP > 0 ? kTiledDP : D) / 8;
    for (int i = threadIdx.x; i < kStagePoints * kPieces; i += kRegThreads) {
      const int r = i / kPieces, c = 8 * (i % kPieces);
      const bool valid = n0 + r < hd.n && c < D;
      const int64_t off = hd.row(valid ? n0 + r : 0) + (c < D ? c : 0);
      const int to = kTiledDP > 0 ? wgmma::tiled_offset(r, c, kTiledDP) : r * st.ldx + c;
#pragma unroll
      for (int t = 0; t < T; ++t) {
        cp_async16(at<bf16>(buf, st.mat[t]) + to, src.mat[t] + off, valid);
      }
    }
    for (int r = threadIdx.x; r < kStagePoints; r += kRegThreads) {
#pragma unroll
      for (int v = 0; v < S; ++v) {
        float* dst = at<float>(buf, st.vec[v]) + r;
        if (n0 + r < hd.n) {
          cp_async4(dst, src.vec[v] + hd.bh * hd.n + n0 + r);
        } else {
          *dst = src.pad[v];
        }
      }
    }
  };
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) {
    if (s0 + k < s1) issue(s0 + k);
    cp_async_commit();
  }
  for (int64_t s = s0; s < s1; ++s) {
    cp_async_wait<kStages - 2>();
    if constexpr (kTiledDP > 0) wgmma::shared_to_async();
    __syncthreads();  // stage s is in; the buffer of s - 1 is free
    if (s + kStages - 1 < s1) issue(s + kStages - 1);
    cp_async_commit();
    consume(static_cast<const unsigned char*>(smem + ((s - s0) % kStages) * st.bytes));
  }
  cp_async_wait<0>();
}

// ldmatrix addresses of a 16-row tile at rows rb of a stage matrix: A
// fragments (m = points, k = 16 of D from col) and, through .trans, B
// fragments (k = points, n = D): lane l gives row l % 8 of matrix l / 8.
__device__ inline const bf16* tile_addr(const bf16* m, int ld, int rb, int col, int lane) {
  return m + (rb + (lane / 8 % 2) * 8 + lane % 8) * ld + col + (lane / 16) * 8;
}

// A stage tile as B fragments (k = the 16 points, n = D in 8-wide tiles).
// (Lanes 0 - 15 of tile_addr address the first 8 columns alone.)
template <int D>
__device__ inline void tile_b_frags(const bf16* m, int ld, int rb, int lane,
                                    uint32_t (&b)[D / 8][2]) {
#pragma unroll
  for (int k = 0; k < ksteps(D); ++k) {
    if (half_step<D>(k)) {
      uint32_t t[2];
      ldmatrix_x2_trans(t, tile_addr(m, ld, rb, 16 * k, lane));
      b[2 * k][0] = t[0];
      b[2 * k][1] = t[1];
    } else {
      uint32_t t[4];
      ldmatrix_x4_trans(t, tile_addr(m, ld, rb, 16 * k, lane));
      b[2 * k][0] = t[0];
      b[2 * k][1] = t[1];
      b[2 * k + 1][0] = t[2];
      b[2 * k + 1][1] = t[3];
    }
  }
}

// A stage tile as A fragments (m = the 16 points, k = D).
template <int D>
__device__ inline void tile_a_frags(const bf16* m, int ld, int rb, int lane,
                                    uint32_t (&a)[ksteps(D)][4]) {
#pragma unroll
  for (int k = 0; k < ksteps(D); ++k) {
    if (half_step<D>(k)) {
      uint32_t t[2];
      ldmatrix_x2(t, tile_addr(m, ld, rb, 16 * k, lane));
      a[k][0] = t[0];
      a[k][1] = t[1];
      a[k][2] = 0u;
      a[k][3] = 0u;
    } else {
      ldmatrix_x4(a[k], tile_addr(m, ld, rb, 16 * k, lane));
    }
  }
}

// A chunk's (16 slices from s) rows of a (G, D) bf16 matrix in global
// memory as B fragments (k = D, n = slices): f[j][k][0..1] for the 8-slice
// tiles j = 0, 1. Zero-cost to hold for a warp that owns the chunk.
template <int D>
__device__ inline void chunk_b_frags(const bf16* m, int s, int lane,
                                     uint32_t (&f)[2][ksteps(D)][2]) {
  const int r0 = lane / 4, c0 = 2 * (lane % 4);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const bf16* row = m + (s + 8 * j + r0) * D + c0;
#pragma unroll
    for (int k = 0; k < ksteps(D); ++k) {
      f[j][k][0] = load_u32(row + 16 * k);
      f[j][k][1] = half_step<D>(k) ? 0u : load_u32(row + 16 * k + 8);
    }
  }
}

// The transpose of a 16 x 16 block held as C fragments v[j][0..3] (points x
// slices), packed to bf16, as an A fragment (slices x points): blocks
// (0,0), (1,0), (0,1), (1,1) of the transpose are the transposes of the
// blocks (0,0), (0,1), (1,0), (1,1).
__device__ inline void pack_transposed(const float (&v)[2][4], uint32_t (&t)[4]) {
  t[0] = transpose8(pack_bf16(v[0][0], v[0][1]));
  t[1] = transpose8(pack_bf16(v[1][0], v[1][1]));
  t[2] = transpose8(pack_bf16(v[0][2], v[0][3]));
  t[3] = transpose8(pack_bf16(v[1][2], v[1][3]));
}

// Adds a warp's (16 x D) C-fragment accumulator of rows s + lane/4 and
// s + lane/4 + 8 to out (G x D fp32).
template <int D>
__device__ inline void add_accumulator(float* out, int s, int lane, const float (&acc)[D / 8][4]) {
  const int r0 = lane / 4, c0 = 2 * (lane % 4);
#pragma unroll
  for (int db = 0; db < D / 8; ++db) {
    float* o = out + (s + r0) * D + 8 * db + c0;
    atomicAdd(o, acc[db][0]);
    atomicAdd(o + 1, acc[db][1]);
    atomicAdd(o + 8 * D, acc[db][2]);
    atomicAdd(o + 8 * D + 1, acc[db][3]);
  }
}

// add_accumulator, and the per-lane column sums cs[j][e] (slices s + 8 j +
// c0 + e) to colsum when not null.
template <int D>
__device__ inline void add_chunk(float* out, float* colsum, int s, int lane,
                                 const float (&acc)[D / 8][4], const float (&cs)[2][2]) {
  const int c0 = 2 * (lane % 4);
  add_accumulator<D>(out, s, lane, acc);
  if (colsum == nullptr) return;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float v = cs[j][e];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      if (lane < 4) atomicAdd(colsum + s + 8 * j + c0 + e, v);
    }
  }
}

// Reduce: warp w of a block owns reduce_chunks(D) chunks of 16 slices, q =
// (blockIdx.z C + i) W + w, for the whole launch and keeps their ws
// fragments and bias in registers; stages hold x, y and lse (+inf past the
// end, so that those weights are exactly zero). Two blocks fit on an SM
// either way: at D 56 two chunks a warp needed 179 registers and one
// block, and one chunk took the 24 reduces of a step from 11.5 to 10.4 ms
// on an H200; at D 32 one chunk a warp ran slower (1.8 against 2.2 ms),
// the block's stages being read by twice as many blocks.
__host__ __device__ constexpr int reduce_chunks(int d) { return d <= 32 ? 2 : 1; }

template <int D>
__global__ void __launch_bounds__(kRegThreads, 2)
    reduce_kernel(Problem p, const bf16* __restrict__ y, float* __restrict__ acc_out,
                  float* __restrict__ colsum_out, int stages_per_block) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int C = reduce_chunks(D);
  const int g = static_cast<int>(p.slices);
  const auto st = make_stage<2, 1>(D);
  const Head hd = block_head(p, D, g);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int c0 = 2 * (lane % 4), chunks = g / 16;
  const auto chunk_of = [&](int i) { return (int(blockIdx.z) * C + i) * kRegWarps + warp; };

  const float scale2 = kLog2e / p.tau[hd.h];
  uint32_t wsb[C][2][ksteps(D)][2];
  float b2[C][2][2];
#pragma unroll
  for (int i = 0; i < C; ++i) {
    const int s = chunk_of(i) < chunks ? 16 * chunk_of(i) : 0;
    chunk_b_frags<D>(static_cast<const bf16*>(p.ws), s, lane, wsb[i]);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      b2[i][j][0] = p.bias[s + 8 * j + c0] * scale2;
      b2[i][j][1] = p.bias[s + 8 * j + c0 + 1] * scale2;
    }
  }

  float acc[C][D / 8][4] = {};
  float cs[C][2][2] = {};  // slices 8 j + c0 + e of chunk i, summed over the lane's rows
  const StageSources<2, 1> src{{static_cast<const bf16*>(p.x), y}, {p.lse}, {INFINITY}};
  const auto [s0, s1] = block_tiles(p, stages_per_block, kStagePoints);
  run_stages<D>(st, src, smem, hd, s0, s1, [&](const unsigned char* buf) {
    if (chunk_of(0) >= chunks) return;
    const bf16* xs = reinterpret_cast<const bf16*>(buf + st.mat[0]);
    const bf16* ys = reinterpret_cast<const bf16*>(buf + st.mat[1]);
    const float* ls = reinterpret_cast<const float*>(buf + st.vec[0]);
    const int r0 = lane / 4;
#pragma unroll 1
    for (int rb = 0; rb < kStagePoints; rb += kRowTile) {
      uint32_t xa[ksteps(D)][4], yb[D / 8][2];
      tile_a_frags<D>(xs, st.ldx, rb, lane, xa);
      tile_b_frags<D>(ys, st.ldx, rb, lane, yb);
      const float la2 = ls[rb + r0] * kLog2e, lb2 = ls[rb + r0 + 8] * kLog2e;
#pragma unroll
      for (int i = 0; i < C; ++i) {
        if (chunk_of(i) >= chunks) continue;
        float w[2][4];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int k = 0; k < ksteps(D); ++k) {
            mma_k<D>(c, xa[k], wsb[i][j][k][0], wsb[i][j][k][1], k);
          }
          w[j][0] = exp2_approx(fmaf(c[0], scale2, b2[i][j][0]) - la2);
          w[j][1] = exp2_approx(fmaf(c[1], scale2, b2[i][j][1]) - la2);
          w[j][2] = exp2_approx(fmaf(c[2], scale2, b2[i][j][0]) - lb2);
          w[j][3] = exp2_approx(fmaf(c[3], scale2, b2[i][j][1]) - lb2);
          cs[i][j][0] += w[j][0] + w[j][2];
          cs[i][j][1] += w[j][1] + w[j][3];
        }
        uint32_t wt[4];
        pack_transposed(w, wt);
#pragma unroll
        for (int db = 0; db < D / 8; ++db) mma_16816(acc[i][db], wt, yb[db][0], yb[db][1]);
      }
    }
  });
#pragma unroll
  for (int i = 0; i < C; ++i) {
    if (chunk_of(i) >= chunks) continue;
    add_chunk<D>(acc_out + hd.bh * int64_t(g) * D,
                 colsum_out == nullptr ? nullptr : colsum_out + hd.bh * g, 16 * chunk_of(i), lane,
                 acc[i], cs[i]);
  }
}

// reduce_wg_kernel, on Hopper (above D 32, where it is faster than
// reduce_kernel): warpgroup w of a block owns the 64 slices
// from 64 (2 blockIdx.z + w), each warp 16 of them, with their ws rows as
// A fragments in registers. Per stage (tiled x, y and lse of 64 points) a
// warpgroup forms the transposed logits (its 64 slices x the 64 points:
// ws x^T, k = D, B = the x stage K-major), turns them into the weights in
// place and multiplies those, as A fragments straight from the
// accumulators (k = points), by the y stage (MN-major): acc (slices x D).
constexpr int kWgReduceSlices = 64;  // slices a warpgroup owns

// Rows s + lane/4 and s + lane/4 + 8 of a (G, D) bf16 matrix in global
// memory as A fragments (k = D; zero for the missing half of a half step).
template <int D>
__device__ inline void rows_a_frags(const bf16* m, int s, int lane, uint32_t (&a)[ksteps(D)][4]) {
  const bf16* ra = m + (s + lane / 4) * D + 2 * (lane % 4);
  const bf16* rb = ra + 8 * D;
#pragma unroll
  for (int k = 0; k < ksteps(D); ++k) {
    const bool whole = !half_step<D>(k);
    a[k][0] = load_u32(ra + 16 * k);
    a[k][1] = load_u32(rb + 16 * k);
    a[k][2] = whole ? load_u32(ra + 16 * k + 8) : 0u;
    a[k][3] = whole ? load_u32(rb + 16 * k + 8) : 0u;
  }
}

// Adds a warp's accumulator of rows s + lane/4, s + lane/4 + 8 (C
// fragments, 8-wide tiles of D) to out (G x D fp32), and its per-lane row
// sums rs[0], rs[1], summed over the row's four lanes, to sums.
template <int D>
__device__ inline void add_rows(float* out, float* sums, int s, int lane,
                                const float (&acc)[D / 8][4], float (&rs)[2]) {
  const int r0 = lane / 4;
  add_accumulator<D>(out, s, lane, acc);
  if (sums == nullptr) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rs[r] += __shfl_xor_sync(0xffffffffu, rs[r], 1);
    rs[r] += __shfl_xor_sync(0xffffffffu, rs[r], 2);
  }
  if (lane % 4 == 0) {
    atomicAdd(sums + s + r0, rs[0]);
    atomicAdd(sums + s + r0 + 8, rs[1]);
  }
}

template <int D>
__global__ void __launch_bounds__(kRegThreads, 2)
    reduce_wg_kernel(Problem p, const bf16* __restrict__ y, float* __restrict__ acc_out,
                     float* __restrict__ colsum_out, int stages_per_block) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int KS = ksteps(D), DP = 16 * KS;
  const int g = static_cast<int>(p.slices);
  const auto st = make_stage<2, 1>(D, DP);
  const Head hd = block_head(p, D, g);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int r0 = lane / 4, c0 = 2 * (lane % 4);
  const int group = int(blockIdx.z) * (kRegWarps / 4) + warp / 4;
  const bool owner = (group + 1) * kWgReduceSlices <= g;  // uniform over the warpgroup
  const int s = owner ? group * kWgReduceSlices + 16 * (warp % 4) : 0;  // this warp's rows

  // Rows s + r0 and s + r0 + 8 of ws as A fragments (k = D) and of bias2.
  const float scale2 = kLog2e / p.tau[hd.h];
  uint32_t wsa[KS][4];
  rows_a_frags<D>(static_cast<const bf16*>(p.ws), s, lane, wsa);
  const float ba = p.bias[s + r0] * scale2, bb = p.bias[s + r0 + 8] * scale2;

  float acc[D / 8][4] = {};
  float cs[2] = {0.f, 0.f};  // rows s + r0, s + r0 + 8, over the lane's points
  const StageSources<2, 1> src{{static_cast<const bf16*>(p.x), y}, {p.lse}, {INFINITY}};
  const auto [s0, s1] = block_tiles(p, stages_per_block, kStagePoints);
  run_stages<D, 2, 1, DP>(st, src, smem, hd, s0, s1, [&](const unsigned char* buf) {
    if (!owner) return;
    const bf16* xs = reinterpret_cast<const bf16*>(buf + st.mat[0]);
    const bf16* ys = reinterpret_cast<const bf16*>(buf + st.mat[1]);
    const float* ls = reinterpret_cast<const float*>(buf + st.vec[0]);
    float c[kStagePoints / 8][4];
    const uint64_t xk = wgmma::k_major(xs, 0, 0, DP), ym = wgmma::mn_major(ys, 0, DP);
    wgmma::touch(c);
    wgmma::fence();
    wgmma::mma<kStagePoints, 0, false>(c, wsa[0], xk);
#pragma unroll
    for (int k = 1; k < KS; ++k) {
      wgmma::mma<kStagePoints, 0, true>(c, wsa[k],
                                        wgmma::advance(xk, uint32_t(2 * k) * wgmma::col_stride()));
    }
    wgmma::commit_and_wait();
    wgmma::touch(c);
    // The weights (rows: slices; columns: points 8 j + c0 + {0, 1}), as A
    // fragments of k = 16 points: tiles 2 kk and 2 kk + 1.
    uint32_t a[kStagePoints / 16][4];
#pragma unroll
    for (int j = 0; j < kStagePoints / 8; ++j) {
      const float l0 = ls[8 * j + c0] * kLog2e, l1 = ls[8 * j + c0 + 1] * kLog2e;
      const float w0 = exp2_approx(fmaf(c[j][0], scale2, ba) - l0);
      const float w1 = exp2_approx(fmaf(c[j][1], scale2, ba) - l1);
      const float w2 = exp2_approx(fmaf(c[j][2], scale2, bb) - l0);
      const float w3 = exp2_approx(fmaf(c[j][3], scale2, bb) - l1);
      cs[0] += w0 + w1;
      cs[1] += w2 + w3;
      a[j / 2][(j % 2) * 2] = pack_bf16(w0, w1);
      a[j / 2][(j % 2) * 2 + 1] = pack_bf16(w2, w3);
    }
    wgmma::touch(acc);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kStagePoints / 16; ++kk) {
      wgmma::mma<D, 1, true>(acc, a[kk],
                             wgmma::advance(ym, uint32_t(2 * kk) * wgmma::row_stride(DP)));
    }
    wgmma::commit_and_wait();  // before the barrier that frees this stage's buffer
    wgmma::touch(acc);
  });
  if (owner) {
    add_rows<D>(acc_out + hd.bh * int64_t(g) * D,
                colsum_out == nullptr ? nullptr : colsum_out + hd.bh * g, s, lane, acc, cs);
  }
}

template <int D>
__global__ void __launch_bounds__(kRegThreads)
    expand_kernel(Problem p, const bf16* __restrict__ z_in, bf16* __restrict__ out,
                  int tiles_per_block) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int g = static_cast<int>(p.slices);
  const RegPlan pl = make_reg_plan(D, g, true);
  const Head hd = block_head(p, D, g);
  const RegBlock rb = reg_setup<D>(pl, smem, p, hd, z_in + hd.bh * int64_t(g) * D);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const auto [t0, t1] = block_tiles(p, tiles_per_block, kRowTile);
  for (int64_t t = t0 + warp; t < t1; t += kRegWarps) {
    const PointTile<D> tile(p, hd, t, lane, true);
    float acc[D / 8][4] = {};
    for (int s0 = 0; s0 < g; s0 += 16) {
      float z[2][4], w[2][4];
      tile.logits(rb.ws, pl.ldk, rb.bias2, rb.scale2, s0, lane, z);
      tile.weights(z, w);
      // The weights as an A fragment (points x slices): blocks (0,0), (1,0),
      // (0,1), (1,1).
      const uint32_t pw[4] = {pack_bf16(w[0][0], w[0][1]), pack_bf16(w[0][2], w[0][3]),
                              pack_bf16(w[1][0], w[1][1]), pack_bf16(w[1][2], w[1][3])};
#pragma unroll
      for (int dt = 0; dt < D / 8; dt += 2) {
        if (dt + 1 < D / 8) {
          uint32_t b[4];
          b_frags_x4(b, rb.zt, pl.ldg, 8 * dt, s0, lane);
          mma_16816(acc[dt], pw, b[0], b[1]);
          mma_16816(acc[dt + 1], pw, b[2], b[3]);
        } else {  // an odd number of 8-wide tiles (D = 56): the last alone
          uint32_t b[2];
          ldmatrix_x2(b, rb.zt + (8 * dt + lane % 8) * pl.ldg + s0 + 8 * (lane / 8 % 2));
          mma_16816(acc[dt], pw, b[0], b[1]);
        }
      }
    }
    tile.store(out, hd, lane, acc);
  }
}

// ---- the backward kernels ----
//
// backward_kernel, row ownership: per 16-point tile a warp makes two
// passes over the chunks of 16 slices, recomputing the logits and dL/dw =
// gout os^T + fx gs^T + gnorm each time:
//   pass 1: the weights; dot = sum_g w dL/dw per point (written out),
//           grad_fx = w gs;
//   pass 2: dL/dz = w (dL/dw - dot), grad_x = (dL/dz / tau) ws, tau's sum.
// The dot is made from the same fp32 weights and dL/dw as pass 2 uses, so
// that sum_g dL/dz is zero per point but for fp32 round-off. (Made instead
// as gout . y + fx . grad_fx + sum_g w gnorm, from sums pass 1 forms with
// bf16-rounded weights, it saved a third of pass 1's MMAs but made the
// temperature's gradient, a largely cancelling sum over all points and
// slices, up to 3.7x less accurate.) Without a deslice (a context
// projector's slice tokens: kDeslice false) the gout terms are zero and
// left out, gout and os unread.
// The B operands whose k runs over slices (ws, os and gs, stored slices x
// D) come through ldmatrix.trans.
// weight_grad_kernel (at head sizes above 32 on Hopper the caller forms
// these sums from the row kernel's dL/dlogits instead: writes_dlogits in
// slice_kernels.h), column ownership (the reduce's pipeline): each warp
// owns one chunk of slices and sums over points grad_ws = (dL/dz / tau)^T
// x and grad_bias = sum (dL/dz / tau), recomputing the weights and dL/dw
// for its chunk from stages of x, gout, fx, lse and dot. Sums over points
// with row ownership would need every warp to add to all G x D sums: as
// shared-memory float atomics (a compare-and-swap loop: ATOMS adds integers
// only) they cost more than the recomputation (2.28 against 1.26 ms).

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

template <int D, bool kDeslice>
__global__ void __launch_bounds__(kBackThreads, 2)
    backward_kernel(Problem p, const bf16* __restrict__ fx, const bf16* __restrict__ gout,
                    const bf16* __restrict__ os_in, const bf16* __restrict__ gs_in,
                    const float* __restrict__ gnorm_in, bf16* __restrict__ grad_x,
                    bf16* __restrict__ grad_fx, float* __restrict__ dot_out,
                    float* __restrict__ tau_acc, int tiles_per_block) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int W = kBackWarps, KS = ksteps(D);
  const int g = static_cast<int>(p.slices);
  const BackPlan pl = make_back_plan(D, g);
  const Head hd = block_head(p, D, g);
  bf16* ws = at<bf16>(smem, pl.ws);
  bf16* os = at<bf16>(smem, pl.os);
  bf16* gs = at<bf16>(smem, pl.gs);
  float* bias2 = at<float>(smem, pl.bias);
  float* gnorm = at<float>(smem, pl.gnorm);
  const int64_t mat = hd.bh * int64_t(g) * D;
  load_matrix<D, W>(ws, pl.ldk, static_cast<const bf16*>(p.ws), g);
  if (kDeslice) load_matrix<D, W>(os, pl.ldk, os_in + mat, g);
  load_matrix<D, W>(gs, pl.ldk, gs_in + mat, g);
  for (int i = threadIdx.x; i < g; i += kBackThreads) gnorm[i] = gnorm_in[hd.bh * g + i];
  const float scale2 = load_bias2<W>(bias2, p, hd.h, g);
  const float inv_tau = 1.0f / p.tau[hd.h];
  __syncthreads();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int c0 = 2 * (lane % 4);
  float tau_sum = 0.0f;  // of (dL/dz) z2, z2 = z log2(e)
  const auto [t0, t1] = block_tiles(p, tiles_per_block, kRowTile);
  for (int64_t t = t0 + warp; t < t1; t += W) {
    const PointTile<D> tile(p, hd, t, lane, true);

    uint32_t go[KS][4], fv[KS][4];
    if (kDeslice) read_a_frags<D>(gout, hd, tile.na, tile.nb, tile.va, tile.vb, c0, go);
    read_a_frags<D>(fx, hd, tile.na, tile.nb, tile.va, tile.vb, c0, fv);
    // A chunk's logits z2, weights w and dL/dw (layout as in logits()).
    const auto chunk = [&](int s0, float(&z)[2][4], float(&w)[2][4], float(&dl)[2][4]) {
      tile.logits(ws, pl.ldk, bias2, scale2, s0, lane, z);
      tile.weights(z, w);
      uint32_t ob[KS][4], gb[KS][4];
#pragma unroll
      for (int k = 0; k < KS; ++k) {
        if (kDeslice) b_frags_k<D>(ob[k], os, pl.ldk, s0, k, lane);
        b_frags_k<D>(gb[k], gs, pl.ldk, s0, k, lane);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int k = 0; k < KS; ++k) {
          if (kDeslice) mma_k<D>(c, go[k], ob[k][2 * j], ob[k][2 * j + 1], k);
          mma_k<D>(c, fv[k], gb[k][2 * j], gb[k][2 * j + 1], k);
        }
        const float n0 = gnorm[s0 + 8 * j + c0], n1 = gnorm[s0 + 8 * j + c0 + 1];
        dl[j][0] = c[0] + n0;
        dl[j][1] = c[1] + n1;
        dl[j][2] = c[2] + n0;
        dl[j][3] = c[3] + n1;
      }
    };

    // Pass 1.
    float dot[2] = {0.f, 0.f};  // rows a, b
    {
      float afx[D / 8][4] = {};
      for (int s0 = 0; s0 < g; s0 += 16) {
        float z[2][4], w[2][4], dl[2][4];
        chunk(s0, z, w, dl);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          dot[0] += w[j][0] * dl[j][0] + w[j][1] * dl[j][1];
          dot[1] += w[j][2] * dl[j][2] + w[j][3] * dl[j][3];
        }
        add_points_slices<D>(afx, w, gs, pl.ldk, s0, lane);
      }
      tile.store(grad_fx, hd, lane, afx);
    }
    tile.store_row_sums(dot_out, hd, lane, dot);

    // Pass 2.
    float ax[D / 8][4] = {};
    for (int s0 = 0; s0 < g; s0 += 16) {
      float z[2][4], w[2][4], dl[2][4], gl[2][4];
      chunk(s0, z, w, dl);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float gz = w[j][e] * (dl[j][e] - dot[e / 2]);  // dL/dz
          tau_sum += gz * z[j][e];
          gl[j][e] = gz * inv_tau;  // dL/dlogits
        }
      }
      add_points_slices<D>(ax, gl, ws, pl.ldk, s0, lane);
    }
    tile.store(grad_x, hd, lane, ax);
  }
  tau_sum = warp_sum(tau_sum) * kLn2;
  if (lane == 0) atomicAdd(tau_acc + hd.h, tau_sum);
}

// ---- the backward on Hopper: warpgroup products ----
//
// backward_wg_kernel makes backward_kernel's two passes with the same
// arithmetic, but a warpgroup (four warps) takes four consecutive 16-point
// tiles, 64 points, at a time, and every product is a wgmma: each chunk's B
// (ws, os, gs) is read from shared memory once for the four warps instead of
// once a warp. The mma.sync kernel is bound by those reads (Nsight Compute:
// shared memory 90 % busy, tensor pipe 47 %). ws, os and gs are tiled
// (wgmma.cuh) with the head dim padded with zeros to DP, a multiple of 16, so
// that the k = D products run in whole steps of 16 (the A fragments' missing
// half of a half step is zero too).

constexpr int kWgPoints = 64;  // points a warpgroup takes at a time

// A warp's 16 points x C slices, C fragments v[j][0..3] (8-slice tiles j),
// as the A fragments of C / 16 k steps (k = slices), packed to bf16.
template <int C>
__device__ inline void pack_slices_a(const float (&v)[C / 8][4], uint32_t (&a)[C / 16][4]) {
#pragma unroll
  for (int h = 0; h < C / 16; ++h) {
    a[h][0] = pack_bf16(v[2 * h][0], v[2 * h][1]);
    a[h][1] = pack_bf16(v[2 * h][2], v[2 * h][3]);
    a[h][2] = pack_bf16(v[2 * h + 1][0], v[2 * h + 1][1]);
    a[h][3] = pack_bf16(v[2 * h + 1][2], v[2 * h + 1][3]);
  }
}

// acc (16 points x D) += a (16 points x C slices) m[C slices, :D], m the
// MN-major descriptor of the batch's first slice in a tiled matrix of DP
// columns (issued into the open wgmma batch).
template <int D, int C, int DP>
__device__ inline void add_slices_product(float (&acc)[D / 8][4], const uint32_t (&a)[C / 16][4],
                                          uint64_t m) {
#pragma unroll
  for (int h = 0; h < C / 16; ++h) {
    wgmma::mma<D, 1, true>(acc, a[h], wgmma::advance(m, h * 2 * wgmma::row_stride(DP)));
  }
}

struct WgBackPlan {
  size_t ws, os, gs, bias, gnorm, stage, load, bytes;
};

// d: the head size; warps: the block's, each with a staging buffer for its
// outputs and three for its next tile's x, fx and gout.
__host__ __device__ inline WgBackPlan make_wg_back_plan(int d, int g, int warps) {
  WgBackPlan pl{};
  size_t off = 0;
  const size_t mat = size_t(g) * 16 * ksteps(d) * sizeof(bf16);
  pl.ws = take(off, mat);
  pl.os = take(off, mat);
  pl.gs = take(off, mat);
  pl.bias = take(off, g * sizeof(float));
  pl.gnorm = take(off, g * sizeof(float));
  pl.stage = take(off, warps * stage_bytes(d));
  pl.load = take(off, 3 * warps * stage_bytes(d));
  pl.bytes = off;
  return pl;
}

// A (G, D) matrix, contiguous, into shared memory tiled with DP columns,
// those past D zero.
template <int D, int DP, int kThreads>
__device__ inline void load_tiled(bf16* dst, const bf16* src, int g) {
  constexpr int kPieces = DP / 8;
  for (int i = threadIdx.x; i < g * kPieces; i += kThreads) {
    const int r = i / kPieces, c = i % kPieces;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (c < D / 8) v = *reinterpret_cast<const uint4*>(src + int64_t(r) * D + c * 8);
    *reinterpret_cast<uint4*>(dst + wgmma::tiled_offset(r, 8 * c, DP)) = v;
  }
}

// C: slices a batch of products (16 or 32; wgmma m64n16 costs 16 SM
// cycles, m64n32 19.5: scripts/wgmma_rate.cu on an H200). W: warps a block.
// kDlogits: pass 2 also writes dL/dlogits, the A operand of its grad_x
// product (the same bf16 values), to dlogits (B, N, H, G), and each tile
// writes its x rows to x_ext (B, N, H, D + 8) with a one and seven zeros
// after them, both in the column orders of slice_kernels.h
// (dlogits_column, x_ext_column): a lane's values of a row, 8 columns
// apart in the fragment, are 16 contiguous bytes there, one store (four
// lanes fill a row's 64 bytes of a batch) where the natural order takes
// four stores of 4 bytes, each half a sector.
template <int D, bool kDeslice, int C, int W, bool kDlogits>
__global__ void __launch_bounds__(W * 32, 16 / W)
    backward_wg_kernel(Problem p, const bf16* __restrict__ fx, const bf16* __restrict__ gout,
                       const bf16* __restrict__ os_in, const bf16* __restrict__ gs_in,
                       const float* __restrict__ gnorm_in, bf16* __restrict__ grad_x,
                       bf16* __restrict__ grad_fx, float* __restrict__ dot_out,
                       float* __restrict__ tau_acc, bf16* __restrict__ dlogits,
                       bf16* __restrict__ x_ext, int groups_per_block) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int KS = ksteps(D), DP = 16 * KS, J = C / 8;  // J: 8-wide slice tiles a batch
  const int g = static_cast<int>(p.slices);
  const WgBackPlan pl = make_wg_back_plan(D, g, W);
  const Head hd = block_head(p, D, g);
  bf16* ws = at<bf16>(smem, pl.ws);
  bf16* os = at<bf16>(smem, pl.os);
  bf16* gs = at<bf16>(smem, pl.gs);
  float* bias2 = at<float>(smem, pl.bias);
  float* gnorm = at<float>(smem, pl.gnorm);
  bf16* const stage =
      at<bf16>(smem, pl.stage) + (threadIdx.x / 32) * (stage_bytes(D) / sizeof(bf16));
  const int64_t mat = hd.bh * int64_t(g) * D;
  load_tiled<D, DP, W * 32>(ws, static_cast<const bf16*>(p.ws), g);
  if (kDeslice) load_tiled<D, DP, W * 32>(os, os_in + mat, g);
  load_tiled<D, DP, W * 32>(gs, gs_in + mat, g);
  for (int i = threadIdx.x; i < g; i += W * 32) gnorm[i] = gnorm_in[hd.bh * g + i];
  const float scale2 = load_bias2<W>(bias2, p, hd.h, g);
  const float inv_tau = 1.0f / p.tau[hd.h];
  wgmma::shared_to_async();
  __syncthreads();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int c0 = 2 * (lane % 4);
  // Descriptors at slice 0, k step 0: 8 slices on is a row of core matrices
  // further, a k step of 16 two core matrices.
  const uint64_t ws_k = wgmma::k_major(ws, 0, 0, DP), os_k = wgmma::k_major(os, 0, 0, DP);
  const uint64_t gs_k = wgmma::k_major(gs, 0, 0, DP);
  const uint64_t ws_mn = wgmma::mn_major(ws, 0, DP), gs_mn = wgmma::mn_major(gs, 0, DP);
  const auto slice_bytes = [](int s0) { return uint32_t(s0 / 8) * wgmma::row_stride(DP); };
  const auto step_bytes = [](int k) { return uint32_t(2 * k) * wgmma::col_stride(); };
  float tau_sum = 0.0f;  // of (dL/dz) z2, z2 = z log2(e)
  const auto [q0, q1] = block_tiles(p, groups_per_block, kWgPoints);
  // Every warp of a warpgroup runs the same iterations (wgmma is collective);
  // tiles past the end read zeros and store nothing.
  // Each tile's x, fx and gout rows come in by cp.async while the tile
  // before it computes (this warp's three load buffers).
  constexpr int kStageElems = static_cast<int>(stage_bytes(D) / sizeof(bf16));
  bf16* const lx = at<bf16>(smem, pl.load) + 3 * warp * kStageElems;
  bf16* const lf = lx + kStageElems;
  bf16* const lg = lf + kStageElems;
  const auto fetch = [&](int64_t q) {
    const int64_t n0 = (4 * q + warp % 4) * kRowTile;
    stage_rows<D>(lx, static_cast<const bf16*>(p.x), hd, n0, lane);
    stage_rows<D>(lf, fx, hd, n0, lane);
    if (kDeslice) stage_rows<D>(lg, gout, hd, n0, lane);
    cp_async_commit();
  };
  if (q0 + warp / 4 < q1) fetch(q0 + warp / 4);
  for (int64_t q = q0 + warp / 4; q < q1; q += W / 4) {
    cp_async_wait<0>();
    __syncwarp();
    const PointTile<D> tile(p, hd, 4 * q + warp % 4, lane, true, lx);

    uint32_t go[KS][4], fv[KS][4];
    if (kDeslice) frags_from_stage<D>(lg, lane, go);
    frags_from_stage<D>(lf, lane, fv);
    __syncwarp();
    if (q + W / 4 < q1) fetch(q + W / 4);

    // A batch's products: the logits (c) and dL/dw - gnorm (d) of C slices.
    struct Products {
      float c[J][4], d[J][4];
    };
    // Issues the products of slices s0 .. s0 + C - 1 into r as one batch,
    // after `first` (more products of the same batch).
    const auto issue = [&](Products& r, int s0, auto&& first) {
      const uint32_t at = slice_bytes(s0);
      wgmma::touch(r.c);
      wgmma::touch(r.d);
      wgmma::fence();
      first();
      // The first product of each sum overwrites its accumulators.
      wgmma::mma<C, 0, false>(r.c, tile.x[0], wgmma::advance(ws_k, at));
#pragma unroll
      for (int k = 1; k < KS; ++k) {
        wgmma::mma<C, 0, true>(r.c, tile.x[k], wgmma::advance(ws_k, at + step_bytes(k)));
      }
      if constexpr (kDeslice) {
        wgmma::mma<C, 0, false>(r.d, go[0], wgmma::advance(os_k, at));
#pragma unroll
        for (int k = 1; k < KS; ++k) {
          wgmma::mma<C, 0, true>(r.d, go[k], wgmma::advance(os_k, at + step_bytes(k)));
        }
      } else {
        wgmma::mma<C, 0, false>(r.d, fv[0], wgmma::advance(gs_k, at));
      }
#pragma unroll
      for (int k = kDeslice ? 0 : 1; k < KS; ++k) {
        wgmma::mma<C, 0, true>(r.d, fv[k], wgmma::advance(gs_k, at + step_bytes(k)));
      }
      wgmma::commit();
    };
    // The logits z2, weights w and dL/dw of the batch from s0 (each lane:
    // rows a, b; slices s0 + 8 j + c0 + {0, 1}) from its finished products.
    const auto finish = [&](Products& r, int s0, float(&z)[J][4], float(&w)[J][4],
                            float(&dl)[J][4]) {
      const float la2 = tile.la * kLog2e, lb2 = tile.lb * kLog2e;
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int s = s0 + 8 * j + c0;
        const float b0 = bias2[s], b1 = bias2[s + 1], n0 = gnorm[s], n1 = gnorm[s + 1];
        z[j][0] = fmaf(r.c[j][0], scale2, b0);
        z[j][1] = fmaf(r.c[j][1], scale2, b1);
        z[j][2] = fmaf(r.c[j][2], scale2, b0);
        z[j][3] = fmaf(r.c[j][3], scale2, b1);
        w[j][0] = tile.va ? exp2_approx(z[j][0] - la2) : 0.0f;
        w[j][1] = tile.va ? exp2_approx(z[j][1] - la2) : 0.0f;
        w[j][2] = tile.vb ? exp2_approx(z[j][2] - lb2) : 0.0f;
        w[j][3] = tile.vb ? exp2_approx(z[j][3] - lb2) : 0.0f;
        dl[j][0] = r.d[j][0] + n0;
        dl[j][1] = r.d[j][1] + n1;
        dl[j][2] = r.d[j][2] + n0;
        dl[j][3] = r.d[j][3] + n1;
      }
    };
    // A pass over the slices: per batch, `use` turns z, w, dl into v (16
    // points x C slices) and names m (G x D, MN-major), and acc (16 points
    // x D) += v m[s0 .. s0 + C - 1, :]. That product goes in the next
    // batch's wgmma group: one wait a batch, nothing in flight across it,
    // and no product under a branch (ptxas serializes those, C7520).
    const auto pass = [&](float(&acc)[D / 8][4], auto&& use) {
      Products r{};
      uint32_t a[C / 16][4];
      uint64_t m = 0;
      const auto product = [&] { add_slices_product<D, C, DP>(acc, a, m); };
      const auto take = [&](int s0) {
        wgmma::wait<0>();
        wgmma::touch(r.c);
        wgmma::touch(r.d);
        float z[J][4], w[J][4], dl[J][4], v[J][4];
        finish(r, s0, z, w, dl);
        m = wgmma::advance(use(s0, z, w, dl, v), slice_bytes(s0));
        pack_slices_a<C>(v, a);
      };
      issue(r, 0, [] {});
      take(0);
      for (int s0 = C; s0 < g; s0 += C) {
        issue(r, s0, product);
        take(s0);
      }
      wgmma::fence();
      product();
      wgmma::commit_and_wait();
      wgmma::touch(acc);
    };

    // Pass 1: dot and grad_fx = w gs.
    float dot[2] = {0.f, 0.f};  // rows a, b
    {
      float afx[D / 8][4] = {};
      pass(afx, [&](int, const float(&)[J][4], const float(&w)[J][4], const float(&dl)[J][4],
                    float(&v)[J][4]) {
#pragma unroll
        for (int j = 0; j < J; ++j) {
          dot[0] += w[j][0] * dl[j][0] + w[j][1] * dl[j][1];
          dot[1] += w[j][2] * dl[j][2] + w[j][3] * dl[j][3];
#pragma unroll
          for (int e = 0; e < 4; ++e) v[j][e] = w[j][e];
        }
        return gs_mn;
      });
      tile.store_staged(grad_fx, hd, lane, afx, stage);
    }
    tile.store_row_sums(dot_out, hd, lane, dot);
    if constexpr (kDlogits) {
      // x_ext's rows a and b from the tile's A fragments: k steps 2 kk and
      // 2 kk + 1 (columns 16 k + 8 m + c0 + {0, 1}, m < 2) are this lane's
      // 16 bytes at 32 kk + 4 c0 (x_ext_column). Then the one at column D
      // and zeros after it: inside the fragments' zero half step at D 56,
      // 16 bytes after them from the row's first lane at D 64.
      static_assert(C == 32 && KS == 4 && (D == DP || D == DP - 8),
                    "dL/dlogits are written for head sizes 56 and 64, slices in batches of 32");
      const int64_t row = (hd.b * hd.n + tile.na) * hd.heads + hd.h;
      bf16* const xa = x_ext + row * (D + 8);
      bf16* const xb = xa + 8 * hd.heads * (D + 8);
      const uint32_t one = c0 == 0 ? pack_bf16(1.0f, 0.0f) : 0u;
#pragma unroll
      for (int kk = 0; kk < KS / 2; ++kk) {
        uint4 wa = make_uint4(tile.x[2 * kk][0], tile.x[2 * kk][2], tile.x[2 * kk + 1][0],
                              tile.x[2 * kk + 1][2]);
        uint4 wb = make_uint4(tile.x[2 * kk][1], tile.x[2 * kk][3], tile.x[2 * kk + 1][1],
                              tile.x[2 * kk + 1][3]);
        if (D < DP && kk == KS / 2 - 1) wa.w = wb.w = one;  // column 56 = 16 * 3 + 8
        if (tile.va) *reinterpret_cast<uint4*>(xa + 32 * kk + 4 * c0) = wa;
        if (tile.vb) *reinterpret_cast<uint4*>(xb + 32 * kk + 4 * c0) = wb;
      }
      if (D == DP && c0 == 0) {
        const uint4 tail = make_uint4(pack_bf16(1.0f, 0.0f), 0u, 0u, 0u);
        if (tile.va) *reinterpret_cast<uint4*>(xa + D) = tail;
        if (tile.vb) *reinterpret_cast<uint4*>(xb + D) = tail;
      }
    }

    // Pass 2: dL/dz, tau's sum and grad_x = (dL/dz / tau) ws.
    float ax[D / 8][4] = {};
    // Rows a and b of dlogits (G wide); a row past the end is not written.
    bf16* const dla =
        kDlogits ? dlogits + ((hd.b * hd.n + tile.na) * hd.heads + hd.h) * g : nullptr;
    pass(ax, [&](int s0, const float(&z)[J][4], const float(&w)[J][4], const float(&dl)[J][4],
                 float(&v)[J][4]) {
#pragma unroll
      for (int j = 0; j < J; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float gz = w[j][e] * (dl[j][e] - dot[e / 2]);  // dL/dz
          tau_sum += gz * z[j][e];
          v[j][e] = gz * inv_tau;  // dL/dlogits
        }
      }
      if constexpr (kDlogits) {
        // Slices s0 + 8 j + c0 + {0, 1} of rows a, b: 16 bytes at s0 + 4 c0
        // (dlogits_column).
        const uint4 ra = make_uint4(pack_bf16(v[0][0], v[0][1]), pack_bf16(v[1][0], v[1][1]),
                                    pack_bf16(v[2][0], v[2][1]), pack_bf16(v[3][0], v[3][1]));
        const uint4 rb = make_uint4(pack_bf16(v[0][2], v[0][3]), pack_bf16(v[1][2], v[1][3]),
                                    pack_bf16(v[2][2], v[2][3]), pack_bf16(v[3][2], v[3][3]));
        if (tile.va) *reinterpret_cast<uint4*>(dla + s0 + 4 * c0) = ra;
        if (tile.vb) *reinterpret_cast<uint4*>(dla + 8 * hd.heads * g + s0 + 4 * c0) = rb;
      }
      return ws_mn;
    });
    tile.store_staged(grad_x, hd, lane, ax, stage);
  }
  tau_sum = warp_sum(tau_sum) * kLn2;
  if (lane == 0) atomicAdd(tau_acc + hd.h, tau_sum);
}

// ---- the forward row kernels on Hopper ----
//
// lse_wg_kernel and expand_wg_kernel do lse_kernel's and expand_kernel's
// work with a warpgroup on 64 points at a time and wgmma products of C = 32
// slices (ws, and expand's z, tiled in shared memory as in the backward).

constexpr int kWgRowWarps = 8;
constexpr int kWgSlices = 32;  // slices a batch of the forward kernels

struct WgRowPlan {
  size_t ws, z, bias, stage, load, bytes;
};

// d: the head size; with_z: expand's z and a staging buffer a warp (of
// kWgRowWarps) for its outputs besides ws; every warp one for its next
// tile's x.
__host__ __device__ inline WgRowPlan make_wg_row_plan(int d, int g, bool with_z) {
  WgRowPlan pl{};
  size_t off = 0;
  const size_t mat = size_t(g) * 16 * ksteps(d) * sizeof(bf16);
  pl.ws = take(off, mat);
  if (with_z) pl.z = take(off, mat);
  pl.bias = take(off, g * sizeof(float));
  if (with_z) pl.stage = take(off, kWgRowWarps * stage_bytes(d));
  pl.load = take(off, kWgRowWarps * stage_bytes(d));
  pl.bytes = off;
  return pl;
}

// The logits of slices s0 .. s0 + C - 1 for a tile, into c (C fragments),
// issued as one batch after `first`.
template <int D, int C, typename First>
__device__ inline void issue_logits(float (&c)[C / 8][4], const PointTile<D>& tile, uint64_t ws_k,
                                    int s0, First&& first) {
  constexpr int DP = 16 * ksteps(D);
  wgmma::touch(c);
  wgmma::fence();
  first();
  const uint64_t at = wgmma::advance(ws_k, uint32_t(s0 / 8) * wgmma::row_stride(DP));
  wgmma::mma<C, 0, false>(c, tile.x[0], at);  // overwrites c
#pragma unroll
  for (int k = 1; k < ksteps(D); ++k) {
    wgmma::mma<C, 0, true>(c, tile.x[k], wgmma::advance(at, uint32_t(2 * k) * wgmma::col_stride()));
  }
  wgmma::commit();
}

template <int D>
__global__ void __launch_bounds__(kWgRowWarps * 32) lse_wg_kernel(Problem p, int groups_per_block) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int DP = 16 * ksteps(D), C = kWgSlices, J = C / 8;
  const int g = static_cast<int>(p.slices);
  const WgRowPlan pl = make_wg_row_plan(D, g, false);
  const Head hd = block_head(p, D, g);
  bf16* ws = at<bf16>(smem, pl.ws);
  float* bias2 = at<float>(smem, pl.bias);
  load_tiled<D, DP, kWgRowWarps * 32>(ws, static_cast<const bf16*>(p.ws), g);
  const float scale2 = load_bias2<kWgRowWarps>(bias2, p, hd.h, g);
  wgmma::shared_to_async();
  __syncthreads();
  const uint64_t ws_k = wgmma::k_major(ws, 0, 0, DP);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, c0 = 2 * (lane % 4);
  const auto [q0, q1] = block_tiles(p, groups_per_block, kWgPoints);
  // Each tile's x rows come in by cp.async while the tile before it
  // computes (this warp's load buffer).
  bf16* const lx = at<bf16>(smem, pl.load) + warp * (stage_bytes(D) / sizeof(bf16));
  const auto fetch = [&](int64_t q) {
    stage_rows<D>(lx, static_cast<const bf16*>(p.x), hd, (4 * q + warp % 4) * kRowTile, lane);
    cp_async_commit();
  };
  if (q0 + warp / 4 < q1) fetch(q0 + warp / 4);
  for (int64_t q = q0 + warp / 4; q < q1; q += kWgRowWarps / 4) {
    cp_async_wait<0>();
    __syncwarp();
    const PointTile<D> tile(p, hd, 4 * q + warp % 4, lane, false, lx);
    __syncwarp();
    if (q + kWgRowWarps / 4 < q1) fetch(q + kWgRowWarps / 4);
    float m[2] = {-INFINITY, -INFINITY}, sum[2] = {0.f, 0.f};  // rows a, b
    const auto add = [&](float(&c)[J][4], int s0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float z[2 * J], cm = -INFINITY;
#pragma unroll
        for (int j = 0; j < J; ++j) {
          const int s = s0 + 8 * j + c0;
          z[2 * j] = fmaf(c[j][2 * r], scale2, bias2[s]);
          z[2 * j + 1] = fmaf(c[j][2 * r + 1], scale2, bias2[s + 1]);
          cm = fmaxf(cm, fmaxf(z[2 * j], z[2 * j + 1]));
        }
        const float mn = fmaxf(m[r], cm);
        float t = sum[r] * exp2_approx(m[r] - mn);
#pragma unroll
        for (int i = 0; i < 2 * J; ++i) t += exp2_approx(z[i] - mn);
        sum[r] = t;
        m[r] = mn;
      }
    };
    // Two batches in flight, both finished inside the iteration.
    float ca[J][4] = {}, cb[J][4] = {};
    for (int s0 = 0; s0 < g; s0 += 2 * C) {
      issue_logits<D, C>(ca, tile, ws_k, s0, [] {});
      issue_logits<D, C>(cb, tile, ws_k, s0 + C, [] {});
      wgmma::wait<1>();
      wgmma::touch(ca);
      add(ca, s0);
      wgmma::wait<0>();
      wgmma::touch(cb);
      add(cb, s0 + C);
    }
    tile.store_lse(p.lse, hd, lane, m, sum);
  }
}

template <int D>
__global__ void __launch_bounds__(kWgRowWarps * 32)
    expand_wg_kernel(Problem p, const bf16* __restrict__ z_in, bf16* __restrict__ out,
                     int groups_per_block) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int DP = 16 * ksteps(D), C = kWgSlices, J = C / 8;
  const int g = static_cast<int>(p.slices);
  const WgRowPlan pl = make_wg_row_plan(D, g, true);
  const Head hd = block_head(p, D, g);
  bf16* ws = at<bf16>(smem, pl.ws);
  bf16* zs = at<bf16>(smem, pl.z);
  bf16* const stage =
      at<bf16>(smem, pl.stage) + (threadIdx.x / 32) * (stage_bytes(D) / sizeof(bf16));
  float* bias2 = at<float>(smem, pl.bias);
  load_tiled<D, DP, kWgRowWarps * 32>(ws, static_cast<const bf16*>(p.ws), g);
  load_tiled<D, DP, kWgRowWarps * 32>(zs, z_in + hd.bh * int64_t(g) * D, g);
  const float scale2 = load_bias2<kWgRowWarps>(bias2, p, hd.h, g);
  wgmma::shared_to_async();
  __syncthreads();
  const uint64_t ws_k = wgmma::k_major(ws, 0, 0, DP), z_mn = wgmma::mn_major(zs, 0, DP);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, c0 = 2 * (lane % 4);
  const auto [q0, q1] = block_tiles(p, groups_per_block, kWgPoints);
  // Each tile's x rows come in by cp.async while the tile before it
  // computes (this warp's load buffer).
  bf16* const lx = at<bf16>(smem, pl.load) + warp * (stage_bytes(D) / sizeof(bf16));
  const auto fetch = [&](int64_t q) {
    stage_rows<D>(lx, static_cast<const bf16*>(p.x), hd, (4 * q + warp % 4) * kRowTile, lane);
    cp_async_commit();
  };
  if (q0 + warp / 4 < q1) fetch(q0 + warp / 4);
  for (int64_t q = q0 + warp / 4; q < q1; q += kWgRowWarps / 4) {
    cp_async_wait<0>();
    __syncwarp();
    const PointTile<D> tile(p, hd, 4 * q + warp % 4, lane, true, lx);
    __syncwarp();
    if (q + kWgRowWarps / 4 < q1) fetch(q + kWgRowWarps / 4);
    const float la2 = tile.la * kLog2e, lb2 = tile.lb * kLog2e;
    float acc[D / 8][4] = {}, c[J][4] = {};
    uint32_t a[C / 16][4];
    uint64_t m = 0;
    // acc += w z[s0 .. s0 + C - 1] of the batch taken last.
    const auto product = [&] { add_slices_product<D, C, DP>(acc, a, m); };
    const auto take = [&](int s0) {
      wgmma::wait<0>();
      wgmma::touch(c);
      float w[J][4];
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int s = s0 + 8 * j + c0;
        const float b0 = bias2[s], b1 = bias2[s + 1];
        w[j][0] = tile.va ? exp2_approx(fmaf(c[j][0], scale2, b0) - la2) : 0.0f;
        w[j][1] = tile.va ? exp2_approx(fmaf(c[j][1], scale2, b1) - la2) : 0.0f;
        w[j][2] = tile.vb ? exp2_approx(fmaf(c[j][2], scale2, b0) - lb2) : 0.0f;
        w[j][3] = tile.vb ? exp2_approx(fmaf(c[j][3], scale2, b1) - lb2) : 0.0f;
      }
      pack_slices_a<C>(w, a);
      m = wgmma::advance(z_mn, uint32_t(s0 / 8) * wgmma::row_stride(DP));
    };
    issue_logits<D, C>(c, tile, ws_k, 0, [] {});
    take(0);
    for (int s0 = C; s0 < g; s0 += C) {
      issue_logits<D, C>(c, tile, ws_k, s0, product);
      take(s0);
    }
    wgmma::fence();
    product();
    wgmma::commit_and_wait();
    wgmma::touch(acc);
    tile.store_staged(out, hd, lane, acc, stage);
  }
}

// grad_ws and grad_bias (see above): the chunk of warp w is blockIdx.z W +
// w; stages hold x, fx, gout (with a deslice), lse (+inf past the end: zero
// weights) and dot.
template <int D, bool kDeslice>
__global__ void __launch_bounds__(kRegThreads, 2)
    weight_grad_kernel(Problem p, const bf16* __restrict__ gout, const bf16* __restrict__ fx,
                       const bf16* __restrict__ os_in, const bf16* __restrict__ gs_in,
                       const float* __restrict__ gnorm_in, const float* __restrict__ dot,
                       float* __restrict__ grad_ws, float* __restrict__ grad_bias,
                       int stages_per_block) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int KS = ksteps(D), T = kDeslice ? 3 : 2;
  const int g = static_cast<int>(p.slices);
  const auto st = make_stage<T, 2>(D);
  const Head hd = block_head(p, D, g);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int r0 = lane / 4, c0 = 2 * (lane % 4);
  const int q = blockIdx.z * kRegWarps + warp;
  const bool owner = q < g / 16;
  const int s = owner ? 16 * q : 0;

  // The chunk's ws, os and gs as B fragments (k = D), bias2 and gnorm.
  const float scale2 = kLog2e / p.tau[hd.h], inv_tau = 1.0f / p.tau[hd.h];
  const int64_t mat = hd.bh * int64_t(g) * D;
  uint32_t wsb[2][KS][2], osb[2][KS][2], gsb[2][KS][2];
  chunk_b_frags<D>(static_cast<const bf16*>(p.ws), s, lane, wsb);
  if (kDeslice) chunk_b_frags<D>(os_in + mat, s, lane, osb);
  chunk_b_frags<D>(gs_in + mat, s, lane, gsb);
  float b2[2][2], gn[2][2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      b2[j][e] = p.bias[s + 8 * j + c0 + e] * scale2;
      gn[j][e] = gnorm_in[hd.bh * g + s + 8 * j + c0 + e];
    }
  }

  float acc[D / 8][4] = {};
  float cs[2][2] = {};  // grad_bias of slices s + 8 j + c0 + e, over the lane's rows
  StageSources<T, 2> src{{static_cast<const bf16*>(p.x), fx}, {p.lse, dot}, {INFINITY, 0.0f}};
  if constexpr (kDeslice) src.mat[2] = gout;
  const auto [s0, s1] = block_tiles(p, stages_per_block, kStagePoints);
  run_stages<D>(st, src, smem, hd, s0, s1, [&](const unsigned char* buf) {
    if (!owner) return;
    const bf16* xs = reinterpret_cast<const bf16*>(buf + st.mat[0]);
    const bf16* fxs = reinterpret_cast<const bf16*>(buf + st.mat[1]);
    const float* ls = reinterpret_cast<const float*>(buf + st.vec[0]);
    const float* ds = reinterpret_cast<const float*>(buf + st.vec[1]);
#pragma unroll 1
    for (int rb = 0; rb < kStagePoints; rb += kRowTile) {
      uint32_t xa[KS][4], ga[KS][4], fa[KS][4], xb[D / 8][2];
      tile_a_frags<D>(xs, st.ldx, rb, lane, xa);
      if constexpr (kDeslice) {
        tile_a_frags<D>(reinterpret_cast<const bf16*>(buf + st.mat[T - 1]), st.ldx, rb, lane, ga);
      }
      tile_a_frags<D>(fxs, st.ldx, rb, lane, fa);
      tile_b_frags<D>(xs, st.ldx, rb, lane, xb);
      const float la2 = ls[rb + r0] * kLog2e, lb2 = ls[rb + r0 + 8] * kLog2e;
      const float da = ds[rb + r0], db = ds[rb + r0 + 8];
      float gl[2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float c[4] = {0.f, 0.f, 0.f, 0.f}, d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int k = 0; k < KS; ++k) {
          mma_k<D>(c, xa[k], wsb[j][k][0], wsb[j][k][1], k);
          if (kDeslice) mma_k<D>(d, ga[k], osb[j][k][0], osb[j][k][1], k);
          mma_k<D>(d, fa[k], gsb[j][k][0], gsb[j][k][1], k);
        }
        // dL/dlogits = w (dL/dw - dot) / tau
        gl[j][0] = exp2_approx(fmaf(c[0], scale2, b2[j][0]) - la2) * (d[0] + gn[j][0] - da);
        gl[j][1] = exp2_approx(fmaf(c[1], scale2, b2[j][1]) - la2) * (d[1] + gn[j][1] - da);
        gl[j][2] = exp2_approx(fmaf(c[2], scale2, b2[j][0]) - lb2) * (d[2] + gn[j][0] - db);
        gl[j][3] = exp2_approx(fmaf(c[3], scale2, b2[j][1]) - lb2) * (d[3] + gn[j][1] - db);
#pragma unroll
        for (int e = 0; e < 4; ++e) gl[j][e] *= inv_tau;
        cs[j][0] += gl[j][0] + gl[j][2];
        cs[j][1] += gl[j][1] + gl[j][3];
      }
      uint32_t gt[4];
      pack_transposed(gl, gt);
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) mma_16816(acc[dt], gt, xb[dt][0], xb[dt][1]);
    }
  });
  if (owner) add_chunk<D>(grad_ws, grad_bias, s, lane, acc, cs);
}

// weight_grad_wg_kernel, on Hopper: as reduce_wg_kernel, warpgroup w owns
// 64 slices, each warp 16 with their ws, os and gs rows as A fragments
// (k = D). Per half stage (32 points) it forms the transposed logits and
// dL/dw - gnorm (os gout^T + gs fx^T) from the K-major x, gout and fx
// stages, dL/dlogits = w (dL/dw - dot) / tau in place, and adds that, as A
// fragments (k = points), times the x stage (MN-major) to grad_ws (slices
// x D), its row sums to grad_bias. The product of a half goes in the batch
// of the next; the last one is finished before the stage's barrier. It
// runs at D <= 32 only: above, the three A operands need more than 128
// registers (ptxas spilled and serialized the products at two blocks an
// SM), and at one block an SM it was slower than weight_grad_kernel.
template <int D, bool kDeslice>
__global__ void __launch_bounds__(kRegThreads, 2)
    weight_grad_wg_kernel(Problem p, const bf16* __restrict__ gout, const bf16* __restrict__ fx,
                          const bf16* __restrict__ os_in, const bf16* __restrict__ gs_in,
                          const float* __restrict__ gnorm_in, const float* __restrict__ dot,
                          float* __restrict__ grad_ws, float* __restrict__ grad_bias,
                          int stages_per_block) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int KS = ksteps(D), DP = 16 * KS, T = kDeslice ? 3 : 2, H = kStagePoints / 2;
  const int g = static_cast<int>(p.slices);
  const auto st = make_stage<T, 2>(D, DP);
  const Head hd = block_head(p, D, g);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int r0 = lane / 4, c0 = 2 * (lane % 4);
  const int group = int(blockIdx.z) * (kRegWarps / 4) + warp / 4;
  const bool owner = (group + 1) * kWgReduceSlices <= g;  // uniform over the warpgroup
  const int s = owner ? group * kWgReduceSlices + 16 * (warp % 4) : 0;  // this warp's rows

  // This warp's rows of ws, os and gs as A fragments (k = D).
  const int64_t mat = hd.bh * int64_t(g) * D;
  uint32_t wsa[KS][4], osa[KS][4], gsa[KS][4];
  rows_a_frags<D>(static_cast<const bf16*>(p.ws), s, lane, wsa);
  if constexpr (kDeslice) rows_a_frags<D>(os_in + mat, s, lane, osa);
  rows_a_frags<D>(gs_in + mat, s, lane, gsa);
  const float scale2 = kLog2e / p.tau[hd.h], inv_tau = 1.0f / p.tau[hd.h];
  const float ba = p.bias[s + r0] * scale2, bb = p.bias[s + r0 + 8] * scale2;
  const float na = gnorm_in[hd.bh * g + s + r0], nb = gnorm_in[hd.bh * g + s + r0 + 8];

  float acc[D / 8][4] = {};
  float cs[2] = {0.f, 0.f};  // grad_bias of rows s + r0, s + r0 + 8, over the lane's points
  StageSources<T, 2> src{{static_cast<const bf16*>(p.x), fx}, {p.lse, dot}, {INFINITY, 0.0f}};
  if constexpr (kDeslice) src.mat[2] = gout;
  const auto [s0, s1] = block_tiles(p, stages_per_block, kStagePoints);
  run_stages<D, T, 2, DP>(st, src, smem, hd, s0, s1, [&](const unsigned char* buf) {
    if (!owner) return;
    const bf16* xs = reinterpret_cast<const bf16*>(buf + st.mat[0]);
    const bf16* fxs = reinterpret_cast<const bf16*>(buf + st.mat[1]);
    const bf16* gos = reinterpret_cast<const bf16*>(buf + st.mat[T - 1]);
    const float* ls = reinterpret_cast<const float*>(buf + st.vec[0]);
    const float* ds = reinterpret_cast<const float*>(buf + st.vec[1]);
    const uint64_t xm = wgmma::mn_major(xs, 0, DP);
    float c[H / 8][4], d[H / 8][4];
    uint32_t a[H / 16][4];
    // acc += the last half's dL/dlogits^T (a) x[n0 .. n0 + H - 1].
    const auto product = [&](int n0) {
#pragma unroll
      for (int kk = 0; kk < H / 16; ++kk) {
        wgmma::mma<D, 1, true>(
            acc, a[kk], wgmma::advance(xm, uint32_t((n0 + 16 * kk) / 8) * wgmma::row_stride(DP)));
      }
    };
    // The logits^T and dL/dw^T - gnorm of points n0 .. n0 + H - 1, after `first`.
    const auto issue = [&](int n0, auto&& first) {
      wgmma::touch(c);
      wgmma::touch(d);
      wgmma::touch(acc);
      wgmma::fence();
      first();
      const auto kdesc = [&](const bf16* m, int k) { return wgmma::k_major(m, n0, 16 * k, DP); };
      wgmma::mma<H, 0, false>(c, wsa[0], kdesc(xs, 0));
#pragma unroll
      for (int k = 1; k < KS; ++k) wgmma::mma<H, 0, true>(c, wsa[k], kdesc(xs, k));
      if constexpr (kDeslice) {
        wgmma::mma<H, 0, false>(d, osa[0], kdesc(gos, 0));
#pragma unroll
        for (int k = 1; k < KS; ++k) wgmma::mma<H, 0, true>(d, osa[k], kdesc(gos, k));
      } else {
        wgmma::mma<H, 0, false>(d, gsa[0], kdesc(fxs, 0));
      }
#pragma unroll
      for (int k = kDeslice ? 0 : 1; k < KS; ++k) wgmma::mma<H, 0, true>(d, gsa[k], kdesc(fxs, k));
      wgmma::commit_and_wait();
      wgmma::touch(c);
      wgmma::touch(d);
      wgmma::touch(acc);
    };
    // dL/dlogits^T of points n0 ..: into a, its row sums into cs.
    const auto take = [&](int n0) {
#pragma unroll
      for (int j = 0; j < H / 8; ++j) {
        const int pt = n0 + 8 * j + c0;
        const float l0 = ls[pt] * kLog2e, l1 = ls[pt + 1] * kLog2e, d0 = ds[pt], d1 = ds[pt + 1];
        const float g0 =
            exp2_approx(fmaf(c[j][0], scale2, ba) - l0) * (d[j][0] + na - d0) * inv_tau;
        const float g1 =
            exp2_approx(fmaf(c[j][1], scale2, ba) - l1) * (d[j][1] + na - d1) * inv_tau;
        const float g2 =
            exp2_approx(fmaf(c[j][2], scale2, bb) - l0) * (d[j][2] + nb - d0) * inv_tau;
        const float g3 =
            exp2_approx(fmaf(c[j][3], scale2, bb) - l1) * (d[j][3] + nb - d1) * inv_tau;
        cs[0] += g0 + g1;
        cs[1] += g2 + g3;
        a[j / 2][(j % 2) * 2] = pack_bf16(g0, g1);
        a[j / 2][(j % 2) * 2 + 1] = pack_bf16(g2, g3);
      }
    };
    issue(0, [] {});
    take(0);
    issue(H, [&] { product(0); });
    take(H);
    wgmma::touch(acc);
    wgmma::fence();
    product(H);
    wgmma::commit_and_wait();  // before the barrier that frees this stage's buffer
    wgmma::touch(acc);
  });
  if (owner) add_rows<D>(grad_ws, grad_bias, s, lane, acc, cs);
}

void check_launch(const char* what) { kernels::check_launch("slice kernels", what); }

using kernels::check_cuda;
using kernels::sm_count;

// One wave: at most as many blocks as fit on the device at once, each
// taking an equal run of tiles of its (batch, head).
template <typename Kernel>
dim3 launch_grid(Kernel kernel, int threads, size_t smem, const Problem& p, int* tiles_per_block,
                 int tile, int splits = 1) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)),
             "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize)");
  int per_sm = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  if (per_sm < 1) per_sm = 1;
  const int64_t heads = p.batch * p.heads;
  const int64_t tiles = (p.points + tile - 1) / tile;
  // Rounded down: a block past the wave would double the kernel's time.
  int64_t chunks = int64_t(sm_count()) * per_sm / (heads * splits);
  chunks = std::max<int64_t>(1, std::min(chunks, tiles));
  const int64_t per = (tiles + chunks - 1) / chunks;
  *tiles_per_block = static_cast<int>(per);
  return dim3(static_cast<unsigned>((tiles + per - 1) / per), static_cast<unsigned>(heads),
              static_cast<unsigned>(splits));
}

void check_problem(const Problem& p) {
  if (!supported(p.dim, p.slices)) {
    throw std::invalid_argument("slice kernels: unsupported dim_head " + std::to_string(p.dim) +
                                " / slices " + std::to_string(p.slices));
  }
  if (p.batch * p.heads > 65535) throw std::invalid_argument("slice kernels: too many heads");
}

// The row kernels write whole 16-byte pieces of their outputs' rows.
void check_aligned(const void* out, const char* what) {
  if (reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    throw std::invalid_argument(std::string("slice kernels: ") + what + " must be 16-byte aligned");
  }
}

// How backward's callers get the slice weights' gradient (set_weight_grad_mode).
std::atomic<WeightGrad> weight_grad{WeightGrad::gemm};
// The wgmma kernels run on Hopper unless set_mma_only asks for the mma.sync
// ones (as on other GPUs), for measurements against them.
std::atomic<bool> mma_only_kernels{false};

bool wgmma_kernels() { return !mma_only_kernels.load() && kernels::hopper(); }

// The forward row kernels' wgmma forms need the slices in whole batches.
bool use_wg_rows(const Problem& p, int batch) { return p.slices % batch == 0 && wgmma_kernels(); }

template <int D>
void reduce_d(const Problem& p, const void* y, float* acc, float* colsum, bool compute_lse) {
  if (p.points == 0) return;
  const int g = static_cast<int>(p.slices);
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const size_t smem = make_reg_plan(D, g, false).bytes;
  int per = 0;
  if (compute_lse && use_wg_rows(p, 2 * kWgSlices)) {
    const size_t wg_smem = make_wg_row_plan(D, g, false).bytes;
    const dim3 grid = launch_grid(lse_wg_kernel<D>, kWgRowWarps * 32, wg_smem, p, &per, kWgPoints);
    lse_wg_kernel<D><<<grid, kWgRowWarps * 32, wg_smem, stream>>>(p, per);
    check_launch("lse");
  } else if (compute_lse) {
    const dim3 grid = launch_grid(lse_kernel<D>, kRegThreads, smem, p, &per, kRowTile);
    lse_kernel<D><<<grid, kRegThreads, smem, stream>>>(p, per);
    check_launch("lse");
  }
  // The wgmma reduce where it measured faster (slice_kernels_bench on an
  // H200): D 56 0.374 against 0.423 ms; at D 32 it was slower, 0.272
  // against 0.252.
  if constexpr (D > 32) {
    if (use_wg_rows(p, kWgReduceSlices)) {
      // Two warpgroups a block, 64 slices each: ceil(G / 128) blocks per run
      // of stages.
      const int splits = (g + 2 * kWgReduceSlices - 1) / (2 * kWgReduceSlices);
      const size_t stage_smem = make_stage<2, 1>(D, 16 * ksteps(D)).bytes * kStages;
      const dim3 grid =
          launch_grid(reduce_wg_kernel<D>, kRegThreads, stage_smem, p, &per, kStagePoints, splits);
      reduce_wg_kernel<D><<<grid, kRegThreads, stage_smem, stream>>>(p, static_cast<const bf16*>(y),
                                                                     acc, colsum, per);
      check_launch("reduce");
      return;
    }
  }
  // reduce_chunks(D) chunks of 16 slices a warp: ceil(chunks / (W C))
  // blocks per stage run, every warp of a block walking all of its stages.
  const int per_block = kRegWarps * reduce_chunks(D);
  const int splits = (g / 16 + per_block - 1) / per_block;
  const size_t stage_smem = make_stage<2, 1>(D).bytes * kStages;
  const dim3 grid =
      launch_grid(reduce_kernel<D>, kRegThreads, stage_smem, p, &per, kStagePoints, splits);
  reduce_kernel<D>
      <<<grid, kRegThreads, stage_smem, stream>>>(p, static_cast<const bf16*>(y), acc, colsum, per);
  check_launch("reduce");
}

template <int D>
void expand_d(const Problem& p, const void* z, void* out) {
  if (p.points == 0) return;
  int per = 0;
  if (use_wg_rows(p, kWgSlices)) {
    const size_t wg_smem = make_wg_row_plan(D, static_cast<int>(p.slices), true).bytes;
    const dim3 grid =
        launch_grid(expand_wg_kernel<D>, kWgRowWarps * 32, wg_smem, p, &per, kWgPoints);
    expand_wg_kernel<D><<<grid, kWgRowWarps * 32, wg_smem, static_cast<cudaStream_t>(p.stream)>>>(
        p, static_cast<const bf16*>(z), static_cast<bf16*>(out), per);
    check_launch("expand");
    return;
  }
  const size_t smem = make_reg_plan(D, static_cast<int>(p.slices), true).bytes;
  const dim3 grid = launch_grid(expand_kernel<D>, kRegThreads, smem, p, &per, kRowTile);
  expand_kernel<D><<<grid, kRegThreads, smem, static_cast<cudaStream_t>(p.stream)>>>(
      p, static_cast<const bf16*>(z), static_cast<bf16*>(out), per);
  check_launch("expand");
}

template <int D, bool kDeslice>
void backward_dd(const Problem& p, const bf16* fx, const bf16* gout, const bf16* os, const bf16* gs,
                 const float* gnorm, void* grad_x, void* grad_fx, float* grad_ws, float* grad_bias,
                 float* tau_acc, float* dot, void* dlogits, void* x_ext) {
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const size_t smem = make_back_plan(D, static_cast<int>(p.slices)).bytes;
  int per = 0;
  if (dlogits != nullptr) {
    // Only the 12-warp form writes them (writes_dlogits: D > 32, G % 32 == 0).
    // In place of weight_grad_kernel (9.6 ms a step at D 56 in the
    // GeoTransolver volume profile): the step 138.50/138.52 ms against
    // 140.35/140.03 with it (H200, same-machine A/B, 2026-12-04).
    if constexpr (D > 32) {
      const size_t wg_smem = make_wg_back_plan(D, static_cast<int>(p.slices), 12).bytes;
      const auto kernel = backward_wg_kernel<D, kDeslice, 32, 12, true>;
      const dim3 grid = launch_grid(kernel, 12 * 32, wg_smem, p, &per, kWgPoints);
      kernel<<<grid, 12 * 32, wg_smem, stream>>>(
          p, fx, gout, os, gs, gnorm, static_cast<bf16*>(grad_x), static_cast<bf16*>(grad_fx), dot,
          tau_acc, static_cast<bf16*>(dlogits), static_cast<bf16*>(x_ext), per);
      check_launch("backward");
    } else {
      throw std::invalid_argument("slice kernels: no dlogits at head size 32 and below");
    }
    return;
  }
  if (wgmma_kernels()) {
    const auto launch = [&](auto kernel, int warps) {
      const size_t wg_smem = make_wg_back_plan(D, static_cast<int>(p.slices), warps).bytes;
      const dim3 grid = launch_grid(kernel, warps * 32, wg_smem, p, &per, kWgPoints);
      kernel<<<grid, warps * 32, wg_smem, stream>>>(
          p, fx, gout, os, gs, gnorm, static_cast<bf16*>(grad_x), static_cast<bf16*>(grad_fx), dot,
          tau_acc, nullptr, nullptr, per);
    };
    // Batches of 32 slices where they divide G. Above D 32 their registers
    // (161 at D 56) need blocks of 12 warps, one an SM; at D 32 and below
    // two blocks of 8 fit. On the H200 (slice_kernels_bench 200000 20 D,
    // the backward with its weight gradient): D 56 1.76 ms against 2.09 for
    // batches of 16 and 2.03 for mma.sync; D 32 1.08 against 1.19 and 1.25.
    if (p.slices % 32 != 0) {
      launch(backward_wg_kernel<D, kDeslice, 16, 8, false>, 8);
    } else if constexpr (D > 32) {
      launch(backward_wg_kernel<D, kDeslice, 32, 12, false>, 12);
    } else {
      launch(backward_wg_kernel<D, kDeslice, 32, 8, false>, 8);
    }
  } else {
    const dim3 grid =
        launch_grid(backward_kernel<D, kDeslice>, kBackThreads, smem, p, &per, kRowTile);
    backward_kernel<D, kDeslice><<<grid, kBackThreads, smem, stream>>>(
        p, fx, gout, os, gs, gnorm, static_cast<bf16*>(grad_x), static_cast<bf16*>(grad_fx), dot,
        tau_acc, per);
  }
  check_launch("backward");
  // The wgmma weight gradient where it measured faster (the step's profile
  // on an H200): D 32 2.96 against 3.16 ms a step; at D 56, one block an SM,
  // 10.68 against 9.70.
  if constexpr (D <= 32) {
    if (use_wg_rows(p, kWgReduceSlices)) {
      const int splits =
          static_cast<int>((p.slices + 2 * kWgReduceSlices - 1) / (2 * kWgReduceSlices));
      const size_t stage_smem = make_stage < kDeslice ? 3 : 2,
                   2 > (D, 16 * ksteps(D)).bytes * kStages;
      const dim3 wgrid = launch_grid(weight_grad_wg_kernel<D, kDeslice>, kRegThreads, stage_smem, p,
                                     &per, kStagePoints, splits);
      weight_grad_wg_kernel<D, kDeslice><<<wgrid, kRegThreads, stage_smem, stream>>>(
          p, gout, fx, os, gs, gnorm, dot, grad_ws, grad_bias, per);
      check_launch("weight gradient");
      return;
    }
  }
  // One warp per chunk of 16 slices: ceil(chunks / W) blocks per stage run.
  const int splits = static_cast<int>((p.slices / 16 + kRegWarps - 1) / kRegWarps);
  const size_t stage_smem = make_stage < kDeslice ? 3 : 2, 2 > (D).bytes * kStages;
  const dim3 wgrid = launch_grid(weight_grad_kernel<D, kDeslice>, kRegThreads, stage_smem, p, &per,
                                 kStagePoints, splits);
  weight_grad_kernel<D, kDeslice><<<wgrid, kRegThreads, stage_smem, stream>>>(
      p, gout, fx, os, gs, gnorm, dot, grad_ws, grad_bias, per);
  check_launch("weight gradient");
}

template <int D>
void backward_d(const Problem& p, const void* fx, const void* gout, const void* os, const void* gs,
                const float* gnorm, void* grad_x, void* grad_fx, float* grad_ws, float* grad_bias,
                float* tau_acc, float* dot, void* dlogits, void* x_ext) {
  if (p.points == 0) return;
  const auto* fx_b = static_cast<const bf16*>(fx);
  const auto* gout_b = static_cast<const bf16*>(gout);
  const auto* os_b = static_cast<const bf16*>(os);
  const auto* gs_b = static_cast<const bf16*>(gs);
  if (gout == nullptr) {
    backward_dd<D, false>(p, fx_b, nullptr, nullptr, gs_b, gnorm, grad_x, grad_fx, grad_ws,
                          grad_bias, tau_acc, dot, dlogits, x_ext);
  } else {
    backward_dd<D, true>(p, fx_b, gout_b, os_b, gs_b, gnorm, grad_x, grad_fx, grad_ws, grad_bias,
                         tau_acc, dot, dlogits, x_ext);
  }
}

// Calls f.template operator()<D>() for the head size of p.
template <typename F>
void with_dim(const Problem& p, F&& f) {
  switch (p.dim) {
    case 16:
      f(std::integral_constant<int, 16>{});
      break;
    case 32:
      f(std::integral_constant<int, 32>{});
      break;
    case 56:
      f(std::integral_constant<int, 56>{});
      break;
    default:
      f(std::integral_constant<int, 64>{});
      break;
  }
}

}  // namespace

bool supported(int64_t dim, int64_t slices) {
  return (dim == 16 || dim == 32 || dim == 56 || dim == 64) && slices >= 16 &&
         slices <= kMaxSlices && slices % 16 == 0;
}

void reduce(const Problem& p, const void* y, float* acc, float* colsum, bool compute_lse) {
  check_problem(p);
  with_dim(p, [&](auto d) { reduce_d<decltype(d)::value>(p, y, acc, colsum, compute_lse); });
}

void expand(const Problem& p, const void* z, void* out) {
  check_problem(p);
  check_aligned(out, "expand's out");
  with_dim(p, [&](auto d) { expand_d<decltype(d)::value>(p, z, out); });
}

WeightGrad weight_grad_mode() { return weight_grad.load(); }

void set_weight_grad_mode(WeightGrad mode) { weight_grad = mode; }

void set_mma_only(bool on) { mma_only_kernels = on; }

bool mma_only() { return mma_only_kernels.load(); }

bool writes_dlogits(const Problem& p) {
  return weight_grad_mode() == WeightGrad::gemm && p.dim > 32 && p.dim <= 64 &&
         supported(p.dim, p.slices) && p.slices % 32 == 0 && wgmma_kernels();
}

void backward(const Problem& p, const void* fx, const void* gout, const void* os, const void* gs,
              const float* gnorm, void* grad_x, void* grad_fx, float* grad_ws, float* grad_bias,
              float* tau_acc, float* dot, void* dlogits, void* x_ext) {
  check_problem(p);
  check_aligned(grad_x, "backward's grad_x");
  check_aligned(grad_fx, "backward's grad_fx");
  if ((gout == nullptr) != (os == nullptr)) {
    throw std::invalid_argument("slice kernels: backward needs gout and os both or neither");
  }
  if ((dlogits == nullptr) != (x_ext == nullptr)) {
    throw std::invalid_argument("slice kernels: backward needs dlogits and x_ext both or neither");
  }
  if (dlogits != nullptr && !writes_dlogits(p)) {
    throw std::invalid_argument(
        "slice kernels: backward given dlogits where writes_dlogits is false");
  }
  with_dim(p, [&](auto d) {
    backward_d<decltype(d)::value>(p, fx, gout, os, gs, gnorm, grad_x, grad_fx, grad_ws, grad_bias,
                                   tau_acc, dot, dlogits, x_ext);
  });
}

}  // namespace slipstream::aero::slice_kernels
