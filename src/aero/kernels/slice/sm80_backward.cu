// The backward kernels on mma.sync (m16n8k16): the row kernel (dL/dx,
// dL/dfx, the temperature's sums) and the column-owning weight gradient.
#include "aero/kernels/slice/launchers.h"
#include "aero/kernels/slice/stages.cuh"
#include "aero/kernels/slice/tiles.cuh"

namespace slipstream::aero::slice_kernels::detail {
namespace {

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
// only) they cost more than the recomputation.

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

}  // namespace

template <int D, bool kDeslice>
void launch_backward(const Problem& p, const BackwardArgs& a) {
  const size_t smem = make_back_plan(D, static_cast<int>(p.slices)).bytes;
  int per = 0;
  const dim3 grid =
      launch_grid(backward_kernel<D, kDeslice>, kBackThreads, smem, p, &per, kRowTile);
  backward_kernel<D, kDeslice><<<grid, kBackThreads, smem, stream_of(p)>>>(
      p, a.fx, a.gout, a.os, a.gs, a.gnorm, a.grad_x, a.grad_fx, a.dot, a.tau_acc, per);
  check_launch("backward");
}

template <int D, bool kDeslice>
void launch_weight_grad(const Problem& p, const BackwardArgs& a) {
  // One warp per chunk of 16 slices: ceil(chunks / W) blocks per stage run.
  constexpr int kSources = kDeslice ? 3 : 2;
  const int splits = static_cast<int>((p.slices / 16 + kRegWarps - 1) / kRegWarps);
  const size_t stage_smem = make_stage<kSources, 2>(D).bytes * kStages;
  int per = 0;
  const dim3 grid = launch_grid(weight_grad_kernel<D, kDeslice>, kRegThreads, stage_smem, p, &per,
                                kStagePoints, splits);
  weight_grad_kernel<D, kDeslice><<<grid, kRegThreads, stage_smem, stream_of(p)>>>(
      p, a.gout, a.fx, a.os, a.gs, a.gnorm, a.dot, a.grad_ws, a.grad_bias, per);
  check_launch("weight gradient");
}

template void launch_backward<16, false>(const Problem&, const BackwardArgs&);
template void launch_backward<16, true>(const Problem&, const BackwardArgs&);
template void launch_backward<32, false>(const Problem&, const BackwardArgs&);
template void launch_backward<32, true>(const Problem&, const BackwardArgs&);
template void launch_backward<56, false>(const Problem&, const BackwardArgs&);
template void launch_backward<56, true>(const Problem&, const BackwardArgs&);
template void launch_backward<64, false>(const Problem&, const BackwardArgs&);
template void launch_backward<64, true>(const Problem&, const BackwardArgs&);
template void launch_weight_grad<16, false>(const Problem&, const BackwardArgs&);
template void launch_weight_grad<16, true>(const Problem&, const BackwardArgs&);
template void launch_weight_grad<32, false>(const Problem&, const BackwardArgs&);
template void launch_weight_grad<32, true>(const Problem&, const BackwardArgs&);
template void launch_weight_grad<56, false>(const Problem&, const BackwardArgs&);
template void launch_weight_grad<56, true>(const Problem&, const BackwardArgs&);
template void launch_weight_grad<64, false>(const Problem&, const BackwardArgs&);
template void launch_weight_grad<64, true>(const Problem&, const BackwardArgs&);

}  // namespace slipstream::aero::slice_kernels::detail
