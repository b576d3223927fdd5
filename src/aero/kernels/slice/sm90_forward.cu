// The forward kernels on Hopper's warpgroup products (wgmma): lse and
// expand on 64 points at a time, and reduce above head size 32.
#include "aero/kernels/common/wgmma.cuh"
#include "aero/kernels/slice/launchers.h"
#include "aero/kernels/slice/stages.cuh"
#include "aero/kernels/slice/tiles.cuh"
#include "aero/kernels/slice/wg_tiles.cuh"

namespace slipstream::aero::slice_kernels::detail {
namespace {

// reduce_wg_kernel, on Hopper (above D 32, where it is faster than
// reduce_kernel): warpgroup w of a block owns the 64 slices
// from 64 (2 blockIdx.z + w), each warp 16 of them, with their ws rows as
// A fragments in registers. Per stage (tiled x, y and lse of 64 points) a
// warpgroup forms the transposed logits (its 64 slices x the 64 points:
// ws x^T, k = D, B = the x stage K-major), turns them into the weights in
// place and multiplies those, as A fragments straight from the
// accumulators (k = points), by the y stage (MN-major): acc (slices x D).

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

// ---- the forward row kernels on Hopper ----
//
// lse_wg_kernel and expand_wg_kernel do lse_kernel's and expand_kernel's
// work with a warpgroup on 64 points at a time and wgmma products of C = 32
// slices (ws, and expand's z, tiled in shared memory as in the backward).

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

}  // namespace

template <int D>
void launch_lse_wg(const Problem& p) {
  const size_t smem = make_wg_row_plan(D, static_cast<int>(p.slices), false).bytes;
  int per = 0;
  const dim3 grid = launch_grid(lse_wg_kernel<D>, kWgRowWarps * 32, smem, p, &per, kWgPoints);
  lse_wg_kernel<D><<<grid, kWgRowWarps * 32, smem, stream_of(p)>>>(p, per);
  check_launch("lse");
}

template <int D>
void launch_reduce_wg(const Problem& p, const bf16* y, float* acc, float* colsum) {
  // Two warpgroups a block, 64 slices each: ceil(G / 128) blocks per run
  // of stages.
  const int g = static_cast<int>(p.slices);
  const int splits = (g + 2 * kWgReduceSlices - 1) / (2 * kWgReduceSlices);
  const size_t stage_smem = make_stage<2, 1>(D, 16 * ksteps(D)).bytes * kStages;
  int per = 0;
  const dim3 grid =
      launch_grid(reduce_wg_kernel<D>, kRegThreads, stage_smem, p, &per, kStagePoints, splits);
  reduce_wg_kernel<D><<<grid, kRegThreads, stage_smem, stream_of(p)>>>(p, y, acc, colsum, per);
  check_launch("reduce");
}

template <int D>
void launch_expand_wg(const Problem& p, const bf16* z, bf16* out) {
  const size_t smem = make_wg_row_plan(D, static_cast<int>(p.slices), true).bytes;
  int per = 0;
  const dim3 grid = launch_grid(expand_wg_kernel<D>, kWgRowWarps * 32, smem, p, &per, kWgPoints);
  expand_wg_kernel<D><<<grid, kWgRowWarps * 32, smem, stream_of(p)>>>(p, z, out, per);
  check_launch("expand");
}

template void launch_lse_wg<16>(const Problem&);
template void launch_lse_wg<32>(const Problem&);
template void launch_lse_wg<56>(const Problem&);
template void launch_lse_wg<64>(const Problem&);
template void launch_reduce_wg<56>(const Problem&, const bf16*, float*, float*);
template void launch_reduce_wg<64>(const Problem&, const bf16*, float*, float*);
template void launch_expand_wg<16>(const Problem&, const bf16*, bf16*);
template void launch_expand_wg<32>(const Problem&, const bf16*, bf16*);
template void launch_expand_wg<56>(const Problem&, const bf16*, bf16*);
template void launch_expand_wg<64>(const Problem&, const bf16*, bf16*);

}  // namespace slipstream::aero::slice_kernels::detail
