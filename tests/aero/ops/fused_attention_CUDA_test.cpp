// The fused slice kernels against the plain LibTorch path on the GPU (run by
// scripts/gpu_check.sh; skipped without CUDA). Each case trains-steps one
// physics-attention layer three ways: plain fp32 (the reference), plain
// bf16 autocast (what the recipe ran before), and fused bf16 autocast. The
// fused output and every gradient must be within bf16 tolerance of the
// reference: at most 3x the plain bf16 path's own error, or 2e-2 relative.
// Point counts include ones that are not multiples of the 32-point tile.
#include "aero/kernels/slice/slice_kernels.h"
#include "aero/model/transolver/transolver.h"
#include "aero/ops/slice_ops.h"
#include "core/device/device.h"

#include "support/cuda_skip.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <utility>

namespace slipstream::aero {
namespace {

struct Result {
  torch::Tensor out;
  std::map<std::string, torch::Tensor> grads;  // "x" and every parameter
};

Result step(PhysicsAttention& a, const torch::Tensor& x_in, const torch::Tensor& upstream,
            bool fused, bool bf16) {
  a->fused = fused;
  a->zero_grad();
  auto x = x_in.detach().clone().requires_grad_(true);
  Result r;
  {
    AutocastGuard autocast(x.device(), bf16);
    r.out = a->forward(x).to(torch::kFloat);
  }
  (r.out * upstream).sum().backward();
  r.grads["x"] = x.grad().to(torch::kFloat);
  for (const auto& p : a->named_parameters()) r.grads[p.key()] = p.value().grad().clone();
  return r;
}

using testing::relative_error;

// (channels, heads, slices, points): dim_head 32, 16, 64 and 56 (its last 8
// columns an 8-wide step of the products over D).
using Case = std::tuple<int64_t, int64_t, int64_t, int64_t>;
class FusedAttentionCudaTest : public ::testing::TestWithParam<Case> {};

TEST_P(FusedAttentionCudaTest, FusedMatchesReferenceWithinBf16Tolerance_CUDA) {
  SKIP_WITHOUT_CUDA();
  const auto [channels, heads, slices, points] = GetParam();
  torch::manual_seed(11 + points);
  TransolverOptions o;
  o.n_hidden = channels;
  o.n_head = heads;
  o.slice_num = slices;
  PhysicsAttention a(o);
  {
    torch::NoGradGuard no_grad;
    for (auto& m : a->modules(false)) {
      if (auto* lin = m->as<torch::nn::Linear>()) {
        lin->weight.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(lin->weight.size(1))));
        if (lin->bias.defined()) lin->bias.normal_(0.0, 0.1);
      }
    }
    a->temperature.copy_(torch::linspace(0.5, 1.5, heads).view({1, 1, heads, 1}));
  }
  a->to(torch::kCUDA);
  ASSERT_TRUE(
      slice_ops::kernels_apply(torch::zeros({1, 1, heads, channels / heads},
                                            torch::dtype(torch::kBFloat16).device(torch::kCUDA)),
                               slices));
  const auto x = torch::randn({2, points, channels}, torch::kCUDA);
  const auto upstream = torch::randn({2, points, channels}, torch::kCUDA);

  const auto ref = step(a, x, upstream, /*fused=*/false, /*bf16=*/false);
  const auto plain = step(a, x, upstream, false, true);
  const auto fused = step(a, x, upstream, true, true);

  const double out_plain = relative_error(plain.out, ref.out),
               out_fused = relative_error(fused.out, ref.out);
  std::printf("N=%ld D=%ld G=%ld  output: plain bf16 %.2e fused %.2e\n", static_cast<long>(points),
              static_cast<long>(channels / heads), static_cast<long>(slices), out_plain, out_fused);
  EXPECT_LE(out_fused, std::max(3 * out_plain, 2e-2));
  for (const auto& [name, want] : ref.grads) {
    const double e_plain = relative_error(plain.grads.at(name), want);
    const double e_fused = relative_error(fused.grads.at(name), want);
    std::printf("  grad %-26s plain bf16 %.2e fused %.2e\n", name.c_str(), e_plain, e_fused);
    EXPECT_TRUE(torch::isfinite(fused.grads.at(name)).all().item<bool>()) << name;
    EXPECT_LE(e_fused, std::max(3 * e_plain, 2e-2)) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, FusedAttentionCudaTest,
                         ::testing::Values(Case{256, 8, 256, 1}, Case{256, 8, 256, 31},
                                           Case{256, 8, 256, 33}, Case{256, 8, 256, 1000},
                                           Case{256, 8, 256, 70001}, Case{64, 4, 32, 77},
                                           Case{64, 4, 32, 4099}, Case{128, 2, 128, 2050},
                                           Case{128, 2, 48, 513}, Case{448, 8, 256, 70001},
                                           Case{112, 2, 64, 4099}, Case{224, 4, 48, 33}));

// grad_ws and grad_bias made from the dL/dlogits that the row kernel writes
// (one GEMM with x and a column of ones, both in the kernels' column
// orders) against the weight-gradient kernel that recomputes them, at head
// sizes 56 and 64 with and without a deslice: grad_x and grad_fx come from
// the same arithmetic, bit for bit; grad_ws differs by fp32 summation
// order, grad_bias also by its terms' bf16 rounding.
TEST(SliceBackwardCudaTest, WeightGradientFromDlogitsMatchesItsKernel_CUDA) {
  SKIP_WITHOUT_CUDA();
#ifndef SLIPSTREAM_WITH_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  namespace sk = slice_kernels;
  const int64_t heads = 8, g = 256;
  sk::Problem shape;
  shape.dim = 56;
  shape.slices = g;
  const auto saved = sk::weight_grad_mode();
  sk::set_weight_grad_mode(sk::WeightGrad::gemm);
  if (!sk::writes_dlogits(shape)) {
    sk::set_weight_grad_mode(saved);
    GTEST_SKIP() << "the row kernel writes dL/dlogits on Hopper only";
  }
  const auto bf = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  const auto f = torch::dtype(torch::kFloat).device(torch::kCUDA);
  for (const auto& [d, points] :
       {std::pair<int64_t, int64_t>{56, 33}, {56, 4099}, {56, 70001}, {64, 33}, {64, 70001}}) {
    for (const bool deslice : {true, false}) {
      torch::manual_seed(5 + points);
      slice_ops::Weights in{torch::randn({2, points, heads, d}, bf),
                            torch::randn({g, d}, f) / std::sqrt(static_cast<double>(d)),
                            torch::randn({g}, f) * 0.1, torch::linspace(0.5, 1.5, heads, f)};
      const auto fx = torch::randn({2, points, heads, d}, bf);
      const auto gout = deslice ? torch::randn({2, points, heads, d}, bf) : torch::Tensor();
      const auto os = deslice ? torch::randn({2, heads, g, d}, bf) : torch::Tensor();
      const auto gs = torch::randn({2, heads, g, d}, bf) * 0.1;
      const auto gnorm = torch::randn({2, heads, g}, f) * 0.1;
      const auto lse = slice_ops::reduce_first(in, fx).lse;
      sk::set_weight_grad_mode(sk::WeightGrad::kernel);
      const auto want = slice_ops::backward(in, lse, fx, gout, os, gs, gnorm);
      sk::set_weight_grad_mode(sk::WeightGrad::gemm);
      const auto got = slice_ops::backward(in, lse, fx, gout, os, gs, gnorm);
      const double ws = relative_error(got.grad_ws, want.grad_ws),
                   bias = relative_error(got.grad_bias, want.grad_bias),
                   tau = relative_error(got.tau_acc, want.tau_acc);
      std::printf("D=%ld N=%ld deslice %d: grad_ws %.2e grad_bias %.2e tau %.2e\n",
                  static_cast<long>(d), static_cast<long>(points), deslice ? 1 : 0, ws, bias, tau);
      EXPECT_TRUE(torch::equal(got.grad_x, want.grad_x)) << d << " " << points;
      EXPECT_TRUE(torch::equal(got.grad_fx, want.grad_fx)) << d << " " << points;
      EXPECT_EQ(got.grad_ws.scalar_type(), torch::kFloat);
      EXPECT_EQ(got.grad_bias.scalar_type(), torch::kFloat);
      EXPECT_LE(ws, 1e-3) << d << " " << points;
      EXPECT_LE(bias, 1e-2) << d << " " << points;
      EXPECT_LE(tau, 1e-4) << d << " " << points;
    }
  }
  sk::set_weight_grad_mode(saved);
#endif
}

TEST(FusedAttentionCudaSyncTest, ForwardAndBackwardMakeNoSynchronizingCall_CUDA) {
  SKIP_WITHOUT_CUDA();
  TransolverOptions o;
  o.n_hidden = 256;
  o.n_head = 8;
  o.slice_num = 256;
  PhysicsAttention a(o);
  a->to(torch::kCUDA);
  const auto x = torch::randn({1, 5000, 256}, torch::kCUDA);
  step(a, x, torch::ones_like(x), true, true);  // warm up (first launch set-up)
  ASSERT_TRUE(set_sync_debug_mode(2));
  a->zero_grad();
  auto xg = x.detach().clone().requires_grad_(true);
  {
    AutocastGuard autocast(x.device(), true);
    auto out = a->forward(xg);
    out.sum().backward();
  }
  set_sync_debug_mode(0);
  EXPECT_TRUE(xg.grad().defined());
}

}  // namespace
}  // namespace slipstream::aero
