// The column-owning kernels' pipeline (reduce, weight_grad): stages of 64
// points read into shared memory with cp.async, and the fragments a warp
// takes from them.
#pragma once

#include "aero/kernels/common/wgmma.cuh"
#include "aero/kernels/slice/tiles.cuh"

namespace slipstream::aero::slice_kernels::detail {

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
// end, so that those weights are exactly zero). Above D 32 a warp takes
// one chunk: two would need more registers than two blocks an SM leave;
// at D 32 and below two chunks a warp, so that fewer blocks read each
// block's stages.
__host__ __device__ constexpr int reduce_chunks(int d) { return d <= 32 ? 2 : 1; }

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
}  // namespace slipstream::aero::slice_kernels::detail
