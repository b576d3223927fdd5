// The forward kernels on mma.sync (m16n8k16): lse, reduce, expand.
#include "aero/kernels/slice/launchers.h"
#include "aero/kernels/slice/stages.cuh"
#include "aero/kernels/slice/tiles.cuh"

namespace slipstream::aero::slice_kernels::detail {
namespace {

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

}  // namespace

template <int D>
void launch_lse(const Problem& p) {
  const size_t smem = make_reg_plan(D, static_cast<int>(p.slices), false).bytes;
  int per = 0;
  const dim3 grid = launch_grid(lse_kernel<D>, kRegThreads, smem, p, &per, kRowTile);
  lse_kernel<D><<<grid, kRegThreads, smem, stream_of(p)>>>(p, per);
  check_launch("lse");
}

template <int D>
void launch_reduce(const Problem& p, const bf16* y, float* acc, float* colsum) {
  // reduce_chunks(D) chunks of 16 slices a warp: ceil(chunks / (W C))
  // blocks per stage run, every warp of a block walking all of its stages.
  const int per_block = kRegWarps * reduce_chunks(D);
  const int splits = (static_cast<int>(p.slices) / 16 + per_block - 1) / per_block;
  const size_t stage_smem = make_stage<2, 1>(D).bytes * kStages;
  int per = 0;
  const dim3 grid =
      launch_grid(reduce_kernel<D>, kRegThreads, stage_smem, p, &per, kStagePoints, splits);
  reduce_kernel<D><<<grid, kRegThreads, stage_smem, stream_of(p)>>>(p, y, acc, colsum, per);
  check_launch("reduce");
}

template <int D>
void launch_expand(const Problem& p, const bf16* z, bf16* out) {
  const size_t smem = make_reg_plan(D, static_cast<int>(p.slices), true).bytes;
  int per = 0;
  const dim3 grid = launch_grid(expand_kernel<D>, kRegThreads, smem, p, &per, kRowTile);
  expand_kernel<D><<<grid, kRegThreads, smem, stream_of(p)>>>(p, z, out, per);
  check_launch("expand");
}

template void launch_lse<16>(const Problem&);
template void launch_lse<32>(const Problem&);
template void launch_lse<56>(const Problem&);
template void launch_lse<64>(const Problem&);
template void launch_reduce<16>(const Problem&, const bf16*, float*, float*);
template void launch_reduce<32>(const Problem&, const bf16*, float*, float*);
template void launch_reduce<56>(const Problem&, const bf16*, float*, float*);
template void launch_reduce<64>(const Problem&, const bf16*, float*, float*);
template void launch_expand<16>(const Problem&, const bf16*, bf16*);
template void launch_expand<32>(const Problem&, const bf16*, bf16*);
template void launch_expand<56>(const Problem&, const bf16*, bf16*);
template void launch_expand<64>(const Problem&, const bf16*, bf16*);

}  // namespace slipstream::aero::slice_kernels::detail
