// The fused physics-attention function (slice -> attention -> deslice with
// the slice weights recomputed in the backward) against the plain module
// path, on CPU in fp64: same output and every gradient, including the
// temperatures at and beyond the clamp. This pins the backward's maths; the
// CUDA kernels are held to the same reference on the device
// (fused_attention_CUDA_test).
#include "aero/ops/fused_physics_attention.h"
#include "aero/kernels/slice/slice_kernels.h"
#include "aero/model/transolver/transolver.h"
#include "aero/ops/slice_ops.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>

namespace slipstream::aero {
namespace {

PhysicsAttention make_attention(int64_t channels, int64_t heads, int64_t slices,
                                std::vector<double> temperatures) {
  TransolverOptions o;
  o.n_hidden = channels;
  o.n_head = heads;
  o.slice_num = slices;
  o.fused_attention = false;
  PhysicsAttention a(o);
  torch::NoGradGuard no_grad;
  for (auto& p : a->parameters()) p.normal_(0.0, 0.4);
  a->temperature.copy_(torch::tensor(temperatures).view({1, 1, heads, 1}));
  a->to(torch::kFloat64);
  return a;
}

// The module's forward with the middle taken by fused_physics_attention.
torch::Tensor fused_forward(PhysicsAttention& a, const torch::Tensor& x) {
  const int64_t b = x.size(0), n = x.size(1);
  auto x_mid = a->in_project_x->forward(x).view({b, n, a->heads, a->dim_head});
  auto fx_mid = a->in_project_fx->forward(x).view({b, n, a->heads, a->dim_head});
  auto out = fused_physics_attention(x_mid, fx_mid,
                                     {a->in_project_slice->weight, a->in_project_slice->bias,
                                      a->temperature, a->qkv_project->weight, a->eps});
  return a->out_linear->forward(out.reshape({b, n, a->heads * a->dim_head}));
}

struct Result {
  torch::Tensor out, grad_x;
  std::map<std::string, torch::Tensor> grads;
};

template <typename Forward>
Result run(PhysicsAttention& a, const torch::Tensor& x_in, const torch::Tensor& upstream,
           Forward forward) {
  a->zero_grad();
  auto x = x_in.detach().clone().requires_grad_(true);
  Result r;
  r.out = forward(x);
  (r.out * upstream).sum().backward();
  r.grad_x = x.grad();
  for (const auto& p : a->named_parameters()) r.grads[p.key()] = p.value().grad().clone();
  return r;
}

double max_relative(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got - want).abs().max() / want.abs().max().clamp_min(1e-300)).item<double>();
}

class FusedAttentionCpuTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(FusedAttentionCpuTest, MatchesThePlainPathInOutputAndEveryGradient) {
  const int64_t points = GetParam();
  torch::manual_seed(7 + points);
  // Head temperatures: at the lower clamp bound, inside, and above the upper
  // bound (clamped: its gradient must be zero).
  auto a = make_attention(/*channels=*/32, /*heads=*/4, /*slices=*/12, {0.5, 0.9, 3.0, 6.0});
  const auto x = torch::randn({2, points, 32}, torch::kFloat64);
  const auto upstream = torch::randn({2, points, 32}, torch::kFloat64);

  const auto want = run(a, x, upstream, [&](const torch::Tensor& in) { return a->forward(in); });
  const auto got =
      run(a, x, upstream, [&](const torch::Tensor& in) { return fused_forward(a, in); });

  EXPECT_LT(max_relative(got.out, want.out), 1e-10);
  EXPECT_LT(max_relative(got.grad_x, want.grad_x), 1e-10);
  for (const auto& [name, g] : want.grads) {
    ASSERT_TRUE(got.grads.at(name).defined()) << name;
    if (name == "temperature") {
      EXPECT_EQ(got.grads.at(name)[0][0][3][0].item<double>(), 0.0);
      EXPECT_NE(got.grads.at(name)[0][0][0][0].item<double>(), 0.0);  // at the bound: passes
    }
    EXPECT_LT(max_relative(got.grads.at(name), g), 1e-9) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Points, FusedAttentionCpuTest, ::testing::Values(1, 5, 33, 200));

TEST(FusedAttentionCpuTest, KernelsNeverApplyOffCuda) {
  EXPECT_FALSE(slice_ops::kernels_apply(torch::zeros({1, 8, 8, 32}, torch::kBFloat16), 256));
  TransolverOptions o;
  o.n_hidden = 64;
  o.n_head = 2;
  o.slice_num = 32;
  PhysicsAttention a(o);
  EXPECT_TRUE(a->fused);
  EXPECT_FALSE(a->uses_fused(torch::zeros({1, 8, 2, 32})));
}

TEST(FusedAttentionCpuTest, MismatchedInputsNameTheirShapes) {
  auto a = make_attention(16, 2, 4, {1.0, 1.0});
  const auto x_mid = torch::zeros({1, 3, 2, 8}, torch::kFloat64);
  const auto fx_mid = torch::zeros({1, 4, 2, 8}, torch::kFloat64);
  try {
    fused_physics_attention(x_mid, fx_mid,
                            {a->in_project_slice->weight, a->in_project_slice->bias, a->temperature,
                             a->qkv_project->weight, a->eps});
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("[1, 4, 2, 8]"), std::string::npos);
  }
}

// The row kernel writes dL/dlogits and x_ext in column orders of its own
// (slice_kernels.h); the host reads grad_ws and grad_bias out of their
// product through weight_grads_from_product. A product laid out by the
// header's functions gives back every element in place.
TEST(SliceWeightGradsTest, ProductInTheKernelsOrderGivesEveryGradientInPlace) {
  namespace sk = slice_kernels;
  for (const int64_t d : {56, 64}) {
    for (const int64_t g : {32, 256}) {
      const auto want = torch::randn({g, d + 8}, torch::kFloat64);
      std::vector<int64_t> row(g), col(d + 8);
      for (int64_t s = 0; s < g; ++s) row[s] = sk::dlogits_column(s);
      for (int64_t c = 0; c < d + 8; ++c) col[c] = sk::x_ext_column(c);
      const auto rows = torch::tensor(row), cols = torch::tensor(col);
      // Each a permutation: every stored position taken once.
      EXPECT_TRUE(torch::equal(std::get<0>(rows.sort()), torch::arange(g)));
      EXPECT_TRUE(torch::equal(std::get<0>(cols.sort()), torch::arange(d + 8)));
      auto stored = torch::zeros_like(want);
      stored.index_put_({rows.unsqueeze(1), cols.unsqueeze(0)}, want);
      const auto got = slice_ops::weight_grads_from_product(stored, d);
      EXPECT_TRUE(torch::equal(got.grad_ws, want.narrow(1, 0, d))) << d << " " << g;
      EXPECT_TRUE(torch::equal(got.grad_bias, want.select(1, d))) << d << " " << g;
      EXPECT_TRUE(got.grad_ws.is_contiguous());
    }
  }
  // 32 slices keep their places only where the lanes' 16 bytes line up:
  // slice 8 is the second value of lane 0's run.
  EXPECT_EQ(sk::dlogits_column(8), 2);
  EXPECT_EQ(sk::dlogits_column(2), 8);
  EXPECT_EQ(sk::dlogits_column(40), 34);
  EXPECT_EQ(sk::x_ext_column(56), 38);
  EXPECT_EQ(sk::x_ext_column(64), 64);
}

TEST(SliceWeightGradsTest, OtherShapesAreErrors) {
  EXPECT_THROW(slice_ops::weight_grads_from_product(torch::zeros({256, 40}), 32), c10::Error);
  EXPECT_THROW(slice_ops::weight_grads_from_product(torch::zeros({48, 64}), 56), c10::Error);
  EXPECT_THROW(slice_ops::weight_grads_from_product(torch::zeros({256, 72}), 56), c10::Error);
}

}  // namespace
}  // namespace slipstream::aero
