// The backward kernels on Hopper's warpgroup products (wgmma): the row
// kernel on 64 points at a time (writing dL/dlogits for the weight
// gradient's GEMM where asked) and, at head size 32 and below, the
// column-owning weight gradient.
#include "aero/kernels/common/wgmma.cuh"
#include "aero/kernels/slice/launchers.h"
#include "aero/kernels/slice/stages.cuh"
#include "aero/kernels/slice/tiles.cuh"
#include "aero/kernels/slice/wg_tiles.cuh"

namespace slipstream::aero::slice_kernels::detail {
namespace {

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

// C: slices a batch of products (16 or 32; an m64n32 wgmma costs little more
// than an m64n16 one: dev/probes/wgmma_rate.cu). W: warps a block.
// kDlogits: pass 2 also writes dL/dlogits, the A operand of its grad_x
// product (the same bf16 values), to dlogits (B, N, H, G), and each tile
// writes its x rows to x_ext (B, N, H, D + 8) with a one and seven zeros
// after them, both in the column orders of slice_kernels.h
// (dlogits_column, x_ext_column): a lane's values of a row, 8 columns
// apart in the fragment, are 16 contiguous bytes there, one store (four
// lanes fill a row's 64 bytes of a batch) where the natural order takes
// four stores of 4 bytes, each half a sector.
// kPipe: a pass takes the batches in pairs with two sets of accumulators,
// so that the tensor cores work while the weights are formed (the pass
// below); G a multiple of 2 C, and one block an SM, its registers up to
// 65536 / (32 W) a thread (launch.cu takes it with dlogits, 8 warps).
template <int D, bool kDeslice, int C, int W, bool kDlogits, bool kPipe>
__global__ void __launch_bounds__(W * 32, kPipe ? 1 : 16 / W)
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
    // x D) += v m[s0 .. s0 + C - 1, :]. No product sits under a branch
    // (ptxas serializes those, C7520), and nothing is in flight across an
    // iteration: ptxas serialized every product of a loop that left a
    // batch's accumulators in flight over its back edge (C7514).
    // kPipe: batches in pairs, each with its own accumulators (ra, rb).
    // The pair's two batches of logits and dL/dw go in as two groups (the
    // first after the product of the pair before): the weights of the first
    // are formed while the second's products run, and the second's while
    // the first's product runs.
    // Otherwise: a batch's product goes in the group of the next batch's
    // logits and dL/dw, one wait a batch.
    const auto pass = [&](float(&acc)[D / 8][4], auto&& use) {
      if constexpr (kPipe) {
        Products ra{}, rb{};
        // Zeros: the first pair's product of "the batch before" adds nothing.
        uint32_t a[C / 16][4] = {};
        uint64_t m = gs_mn;
        const auto form = [&](Products& r, int s0, float(&v)[J][4]) {
          wgmma::touch(r.c);
          wgmma::touch(r.d);
          float z[J][4], w[J][4], dl[J][4];
          finish(r, s0, z, w, dl);
          return wgmma::advance(use(s0, z, w, dl, v), slice_bytes(s0));
        };
        const auto product = [&] { add_slices_product<D, C, DP>(acc, a, m); };
        for (int s0 = 0; s0 < g; s0 += 2 * C) {
          issue(ra, s0, product);
          issue(rb, s0 + C, [] {});
          wgmma::wait<1>();
          float v[J][4];
          m = form(ra, s0, v);
          pack_slices_a<C>(v, a);
          wgmma::fence();
          product();
          wgmma::commit();
          wgmma::wait<1>();
          const uint64_t next = form(rb, s0 + C, v);
          wgmma::wait<0>();
          wgmma::touch(acc);
          pack_slices_a<C>(v, a);
          m = next;
        }
        wgmma::fence();
        product();
        wgmma::commit_and_wait();
        wgmma::touch(acc);
      } else {
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
      }
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

}  // namespace

template <int D, bool kDeslice, int C, int W, bool kDlogits, bool kPipe>
void launch_backward_wg(const Problem& p, const BackwardArgs& a) {
  const auto kernel = backward_wg_kernel<D, kDeslice, C, W, kDlogits, kPipe>;
  const size_t smem = make_wg_back_plan(D, static_cast<int>(p.slices), W).bytes;
  int per = 0;
  const dim3 grid = launch_grid(kernel, W * 32, smem, p, &per, kWgPoints);
  kernel<<<grid, W * 32, smem, stream_of(p)>>>(
      p, a.fx, a.gout, a.os, a.gs, a.gnorm, a.grad_x, a.grad_fx, a.dot, a.tau_acc,
      kDlogits ? a.dlogits : nullptr, kDlogits ? a.x_ext : nullptr, per);
  check_launch("backward");
}

template <int D, bool kDeslice>
void launch_weight_grad_wg(const Problem& p, const BackwardArgs& a) {
  constexpr int kSources = kDeslice ? 3 : 2;
  const int splits = static_cast<int>((p.slices + 2 * kWgReduceSlices - 1) / (2 * kWgReduceSlices));
  const size_t stage_smem = make_stage<kSources, 2>(D, 16 * ksteps(D)).bytes * kStages;
  int per = 0;
  const dim3 grid = launch_grid(weight_grad_wg_kernel<D, kDeslice>, kRegThreads, stage_smem, p,
                                &per, kStagePoints, splits);
  weight_grad_wg_kernel<D, kDeslice><<<grid, kRegThreads, stage_smem, stream_of(p)>>>(
      p, a.gout, a.fx, a.os, a.gs, a.gnorm, a.dot, a.grad_ws, a.grad_bias, per);
  check_launch("weight gradient");
}

template void launch_backward_wg<16, false, 16, 8, false, false>(const Problem&,
                                                                 const BackwardArgs&);
template void launch_backward_wg<16, true, 16, 8, false, false>(const Problem&,
                                                                const BackwardArgs&);
template void launch_backward_wg<32, false, 16, 8, false, false>(const Problem&,
                                                                 const BackwardArgs&);
template void launch_backward_wg<32, true, 16, 8, false, false>(const Problem&,
                                                                const BackwardArgs&);
template void launch_backward_wg<56, false, 16, 8, false, false>(const Problem&,
                                                                 const BackwardArgs&);
template void launch_backward_wg<56, true, 16, 8, false, false>(const Problem&,
                                                                const BackwardArgs&);
template void launch_backward_wg<64, false, 16, 8, false, false>(const Problem&,
                                                                 const BackwardArgs&);
template void launch_backward_wg<64, true, 16, 8, false, false>(const Problem&,
                                                                const BackwardArgs&);
template void launch_backward_wg<56, false, 32, 12, false, false>(const Problem&,
                                                                  const BackwardArgs&);
template void launch_backward_wg<56, true, 32, 12, false, false>(const Problem&,
                                                                 const BackwardArgs&);
template void launch_backward_wg<64, false, 32, 12, false, false>(const Problem&,
                                                                  const BackwardArgs&);
template void launch_backward_wg<64, true, 32, 12, false, false>(const Problem&,
                                                                 const BackwardArgs&);
template void launch_backward_wg<16, false, 32, 8, false, false>(const Problem&,
                                                                 const BackwardArgs&);
template void launch_backward_wg<16, true, 32, 8, false, false>(const Problem&,
                                                                const BackwardArgs&);
template void launch_backward_wg<32, false, 32, 8, false, false>(const Problem&,
                                                                 const BackwardArgs&);
template void launch_backward_wg<32, true, 32, 8, false, false>(const Problem&,
                                                                const BackwardArgs&);
template void launch_backward_wg<56, false, 32, 12, true, false>(const Problem&,
                                                                 const BackwardArgs&);
template void launch_backward_wg<56, true, 32, 12, true, false>(const Problem&,
                                                                const BackwardArgs&);
template void launch_backward_wg<64, false, 32, 12, true, false>(const Problem&,
                                                                 const BackwardArgs&);
template void launch_backward_wg<64, true, 32, 12, true, false>(const Problem&,
                                                                const BackwardArgs&);
template void launch_backward_wg<56, false, 32, 8, true, true>(const Problem&, const BackwardArgs&);
template void launch_backward_wg<56, true, 32, 8, true, true>(const Problem&, const BackwardArgs&);
template void launch_backward_wg<64, false, 32, 8, true, true>(const Problem&, const BackwardArgs&);
template void launch_backward_wg<64, true, 32, 8, true, true>(const Problem&, const BackwardArgs&);
template void launch_weight_grad_wg<16, false>(const Problem&, const BackwardArgs&);
template void launch_weight_grad_wg<16, true>(const Problem&, const BackwardArgs&);
template void launch_weight_grad_wg<32, false>(const Problem&, const BackwardArgs&);
template void launch_weight_grad_wg<32, true>(const Problem&, const BackwardArgs&);

}  // namespace
   // slipstream::aero::slice_kernels::detail
