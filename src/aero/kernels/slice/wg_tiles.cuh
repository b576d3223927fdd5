// The warpgroup (wgmma, sm_90a) forms' plans and products: the backward's
// and the forward row kernels'.
#pragma once

#include "aero/kernels/common/wgmma.cuh"
#include "aero/kernels/slice/tiles.cuh"

namespace slipstream::aero::slice_kernels::detail {

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
}  // namespace slipstream::aero::slice_kernels::detail
