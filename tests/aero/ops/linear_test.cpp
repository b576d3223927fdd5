// aero::linear against at::linear (fp64, CPU): output and every gradient,
// for row counts the bias-gradient fold does and does not divide.
#include "aero/ops/linear.h"
#include "aero/ops/numerics_settings.h"
#include "aero/ops/parameter_casts.h"

#include "support/recipe_support.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>

namespace slipstream::aero {
namespace {

using testing::relative_error;

// numerics.parameter_casts: once (the default) casts once a step, per_use
// at each use; anything else is an error naming the key and the choices.
// On the CPU nothing is cached: find() gives nothing even inside a Scope.
TEST(ParameterCastsTest, TheSwitchAndTheCpu) {
  apply_numerics(numerics_settings(testing::load_config({})), false);
  EXPECT_TRUE(ParameterCasts::enabled());
  apply_numerics(numerics_settings(testing::load_config({"numerics.parameter_casts=per_use"})),
                 false);
  EXPECT_FALSE(ParameterCasts::enabled());
  apply_numerics(numerics_settings(testing::load_config({"numerics.parameter_casts=once"})), false);
  EXPECT_TRUE(ParameterCasts::enabled());
  const auto msg = testing::error_message_of(
      [] { numerics_settings(testing::load_config({"numerics.parameter_casts=sometimes"})); });
  EXPECT_NE(msg.find("'numerics.parameter_casts' is 'sometimes', expected one of: once, per_use"),
            std::string::npos)
      << msg;
  const auto w = torch::randn({4, 3});
  ParameterCasts casts({w});
  EXPECT_EQ(casts.size(), 0u);
  casts.refresh();
  const ParameterCasts::Scope scope(&casts);
  torch::NoGradGuard no_grad;
  EXPECT_EQ(ParameterCasts::find(w), nullptr);
}

TEST(LinearTest, MatchesAtenLinearInOutputAndGradients) {
  const auto f64 = torch::dtype(torch::kDouble);
  for (const auto& shape :
       std::vector<std::vector<int64_t>>{{7, 5}, {2, 12, 6}, {1, 13, 3}, {3, 16, 300}}) {
    torch::manual_seed(shape.back() + shape.size());
    const int64_t in = shape.back(), out = in == 300 ? 40 : 9;
    const auto x0 = torch::randn(shape, f64), w0 = torch::randn({out, in}, f64);
    const auto b0 = torch::randn({out}, f64);
    auto sizes = shape;
    sizes.back() = out;
    const auto up = torch::randn(sizes, f64);

    auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    auto b = b0.clone().requires_grad_(true);
    const auto y = linear(x, w, b);
    (y * up).sum().backward();
    auto xr = x0.clone().requires_grad_(true), wr = w0.clone().requires_grad_(true);
    auto br = b0.clone().requires_grad_(true);
    const auto yr = torch::linear(xr, wr, br);
    (yr * up).sum().backward();

    SCOPED_TRACE(std::to_string(shape.size()) + "-d input, in " + std::to_string(in));
    EXPECT_EQ(y.sizes(), yr.sizes());
    EXPECT_LT(relative_error(y, yr), 1e-13);
    EXPECT_LT(relative_error(x.grad(), xr.grad()), 1e-13);
    EXPECT_LT(relative_error(w.grad(), wr.grad()), 1e-13);
    EXPECT_LT(relative_error(b.grad(), br.grad()), 1e-13);
  }
}

TEST(LinearTest, WithoutBiasOrInputGradient) {
  const auto x = torch::randn({4, 6}, torch::kDouble);  // no grad wanted for x
  auto w = torch::randn({3, 6}, torch::kDouble).requires_grad_(true);
  linear(x, w, torch::Tensor()).sum().backward();
  EXPECT_LT(relative_error(w.grad(), torch::ones({4, 3}, torch::kDouble).t().mm(x)), 1e-13);
}

// linear_pair is two at::linear of one x: outputs and every gradient, with
// both outputs used, and with only the second (the first's gradient
// undefined: its weight and bias get none, x only the second's).
TEST(LinearTest, LinearPairIsTwoLinearsOfOneInput) {
  const auto f64 = torch::dtype(torch::kDouble);
  torch::manual_seed(5);
  const auto x0 = torch::randn({2, 19, 6}, f64);
  const auto w10 = torch::randn({11, 6}, f64), b10 = torch::randn({11}, f64);
  const auto w20 = torch::randn({4, 6}, f64), b20 = torch::randn({4}, f64);
  const auto up1 = torch::randn({2, 19, 11}, f64), up2 = torch::randn({2, 19, 4}, f64);
  for (const bool both : {true, false}) {
    SCOPED_TRACE(both ? "both outputs used" : "the second alone");
    auto leaves = [&] {
      return std::vector<torch::Tensor>{
          x0.clone().requires_grad_(true), w10.clone().requires_grad_(true),
          b10.clone().requires_grad_(true), w20.clone().requires_grad_(true),
          b20.clone().requires_grad_(true)};
    };
    auto got = leaves(), want = leaves();
    const auto [y1, y2] = linear_pair(got[0], got[1], got[2], got[3], got[4]);
    const auto r1 = torch::linear(want[0], want[1], want[2]);
    const auto r2 = torch::linear(want[0], want[3], want[4]);
    EXPECT_LT(relative_error(y1, r1), 1e-13);
    EXPECT_LT(relative_error(y2, r2), 1e-13);
    ((both ? (y1 * up1).sum() : torch::zeros({}, f64)) + (y2 * up2).sum()).backward();
    ((both ? (r1 * up1).sum() : torch::zeros({}, f64)) + (r2 * up2).sum()).backward();
    for (size_t i = 0; i < got.size(); ++i) {
      if (!both && (i == 1 || i == 2)) {
        EXPECT_FALSE(got[i].grad().defined() && got[i].grad().abs().max().item<double>() > 0)
            << "leaf " << i;
        continue;
      }
      EXPECT_LT(relative_error(got[i].grad(), want[i].grad()), 1e-13) << "leaf " << i;
    }
  }
  EXPECT_THROW(linear_pair(x0, w10, b10, w20, torch::Tensor()), c10::Error);
}

// gelu_linear is linear(gelu(h)) with the same ops: bitwise on the CPU in
// fp32, output and every gradient, with h (B, N, C) as an MLP gives it;
// without a bias, the plain ops.
TEST(LinearTest, GeluLinearIsLinearOfGeluBitwise) {
  torch::manual_seed(3);
  const auto h0 = torch::randn({2, 37, 24}), w0 = torch::randn({10, 24}), b0 = torch::randn({10});
  const auto up = torch::randn({2, 37, 10});
  auto h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  auto b = b0.clone().requires_grad_(true);
  const auto y = gelu_linear(h, w, b);
  (y * up).sum().backward();
  auto hr = h0.clone().requires_grad_(true), wr = w0.clone().requires_grad_(true);
  auto br = b0.clone().requires_grad_(true);
  const auto yr = linear(torch::gelu(hr), wr, br);
  (yr * up).sum().backward();
  EXPECT_TRUE(torch::equal(y, yr));
  EXPECT_TRUE(torch::equal(h.grad(), hr.grad()));
  EXPECT_TRUE(torch::equal(w.grad(), wr.grad()));
  EXPECT_TRUE(torch::equal(b.grad(), br.grad()));
  // Without a bias: the plain ops.
  auto w2 = w0.clone().requires_grad_(true);
  gelu_linear(h0, w2, torch::Tensor()).sum().backward();
  EXPECT_LT(
      relative_error(w2.grad(), torch::ones({2 * 37, 10}).t().mm(torch::gelu(h0).view({-1, 24}))),
      1e-6);
}

// gelu_mlp is linear then gelu_linear with the same ops: bitwise on the
// CPU in fp32, output and every gradient (both biases' included).
TEST(LinearTest, GeluMlpIsLinearThenGeluLinearBitwise) {
  torch::manual_seed(4);
  const auto x0 = torch::randn({2, 29, 12}), w10 = torch::randn({40, 12}) * 0.3;
  const auto b10 = torch::randn({40}), w20 = torch::randn({12, 40}) * 0.2;
  const auto b20 = torch::randn({12}), up = torch::randn({2, 29, 12});
  const auto leaf = [](const torch::Tensor& t) { return t.clone().requires_grad_(true); };
  auto x = leaf(x0), w1 = leaf(w10), b1 = leaf(b10), w2 = leaf(w20), b2 = leaf(b20);
  const auto y = gelu_mlp(x, w1, b1, w2, b2);
  (y * up).sum().backward();
  auto xr = leaf(x0), w1r = leaf(w10), b1r = leaf(b10), w2r = leaf(w20), b2r = leaf(b20);
  const auto yr = gelu_linear(linear(xr, w1r, b1r), w2r, b2r);
  (yr * up).sum().backward();
  EXPECT_TRUE(torch::equal(y, yr));
  EXPECT_TRUE(torch::equal(x.grad(), xr.grad()));
  EXPECT_TRUE(torch::equal(w1.grad(), w1r.grad()));
  EXPECT_TRUE(torch::equal(b1.grad(), b1r.grad()));
  EXPECT_TRUE(torch::equal(w2.grad(), w2r.grad()));
  EXPECT_TRUE(torch::equal(b2.grad(), b2r.grad()));
  EXPECT_THROW(gelu_mlp(x0, w10, torch::Tensor(), w20, b20), c10::Error);
}

// gelu_mlp's keep_gelu keeps gelu(h) for the backward instead of
// recomputing it: the same output and gradients, bitwise (CPU, fp32), with
// a residual and without.
TEST(LinearTest, GeluMlpKeepingGeluGivesTheRecomputedGradients) {
  torch::manual_seed(5);
  const auto x0 = torch::randn({2, 29, 12}), w10 = torch::randn({40, 12}) * 0.3;
  const auto b10 = torch::randn({40}), w20 = torch::randn({12, 40}) * 0.2;
  const auto b20 = torch::randn({12}), r0 = torch::randn({2, 29, 12});
  const auto up = torch::randn({2, 29, 12});
  const auto leaf = [](const torch::Tensor& t) { return t.clone().requires_grad_(true); };
  for (const bool with_residual : {false, true}) {
    std::vector<std::vector<torch::Tensor>> grads;
    std::vector<torch::Tensor> outs;
    for (const bool keep : {false, true}) {
      auto x = leaf(x0), w1 = leaf(w10), b1 = leaf(b10), w2 = leaf(w20), b2 = leaf(b20);
      const auto y = gelu_mlp(x, w1, b1, w2, b2, with_residual ? r0 : torch::Tensor(), keep);
      (y * up).sum().backward();
      outs.push_back(y.detach());
      grads.push_back({x.grad(), w1.grad(), b1.grad(), w2.grad(), b2.grad()});
    }
    EXPECT_TRUE(torch::equal(outs[0], outs[1])) << with_residual;
    for (size_t i = 0; i < grads[0].size(); ++i) {
      EXPECT_TRUE(torch::equal(grads[0][i], grads[1][i])) << with_residual << " " << i;
    }
  }
}

// Off the GPU's epilogue path the residual forms are the add after the
// function, bitwise, and the residual's gradient is the output's.
TEST(LinearTest, ResidualFormsAreTheAddAfterwardsBitwise) {
  torch::manual_seed(6);
  const auto x0 = torch::randn({2, 29, 12}), r0 = torch::randn({2, 29, 12});
  const auto w10 = torch::randn({40, 12}) * 0.3, b10 = torch::randn({40});
  const auto w20 = torch::randn({12, 40}) * 0.2, b20 = torch::randn({12});
  const auto wo0 = torch::randn({12, 12}) * 0.3, up = torch::randn({2, 29, 12});
  const auto leaf = [](const torch::Tensor& t) { return t.clone().requires_grad_(true); };
  for (const bool mlp : {false, true}) {
    std::vector<torch::Tensor> with, apart;
    for (const auto& t : {x0, r0, w10, b10, w20, b20, wo0}) {
      with.push_back(leaf(t));
      apart.push_back(leaf(t));
    }
    const auto run = [&](std::vector<torch::Tensor>& p, bool fused) {
      const auto &x = p[0], &r = p[1], &w1 = p[2], &b1 = p[3], &w2 = p[4], &b2 = p[5], &wo = p[6];
      const auto y =
          mlp ? (fused ? gelu_mlp(x, w1, b1, w2, b2, r) : gelu_mlp(x, w1, b1, w2, b2) + r)
              : (fused ? linear_residual(x, wo, b2, r) : linear(x, wo, b2) + r);
      (y * up).sum().backward();
      return y.detach();
    };
    EXPECT_TRUE(torch::equal(run(with, true), run(apart, false))) << mlp;
    for (size_t i = 0; i < with.size(); ++i) {
      ASSERT_EQ(with[i].grad().defined(), apart[i].grad().defined()) << mlp << " " << i;
      if (with[i].grad().defined()) {
        EXPECT_TRUE(torch::equal(with[i].grad(), apart[i].grad())) << mlp << " " << i;
      }
    }
    EXPECT_TRUE(torch::equal(with[1].grad(), up)) << mlp;  // the residual's gradient
  }
  // An undefined residual is the function alone; no bias: at::linear + r.
  EXPECT_TRUE(torch::equal(linear_residual(x0, wo0, b20, {}), linear(x0, wo0, b20)));
  EXPECT_TRUE(torch::equal(linear_residual(x0, wo0, {}, r0), at::linear(x0, wo0) + r0));
}

TEST(LinearTest, ColumnSumFoldsRowsAndAccumulatesInFloat) {
  const auto m = torch::randn({4000, 256}).to(torch::kBFloat16);
  const auto s = column_sum(m);
  EXPECT_EQ(s.scalar_type(), torch::kFloat);
  EXPECT_EQ(s.sizes(), (std::vector<int64_t>{256}));
  EXPECT_LT(relative_error(s, m.to(torch::kDouble).sum(0).to(torch::kFloat)), 1e-6);
  const auto odd = torch::randn({7, 3}, torch::kDouble);  // no fold divides 7
  EXPECT_LT(relative_error(column_sum(odd), odd.sum(0)), 1e-15);
}

// An offer holds for that very tensor while it is alive and unchanged: not
// for a view or an equal copy, not after an in-place change.
TEST(LinearTest, OfferedColumnSumsHoldForThatTensorUnchanged) {
  auto g = torch::randn({5, 3});
  const auto sums = torch::tensor({1.0f, 2.0f, 3.0f});
  EXPECT_FALSE(offered_column_sums(g).defined());
  offer_column_sums(g, sums);
  ASSERT_TRUE(offered_column_sums(g).defined());
  EXPECT_TRUE(torch::equal(offered_column_sums(g), sums));
  EXPECT_FALSE(offered_column_sums(g.view({5, 3})).defined());
  EXPECT_FALSE(offered_column_sums(g.clone()).defined());
  g.add_(1);
  EXPECT_FALSE(offered_column_sums(g).defined());
  EXPECT_THROW(offer_column_sums(g, torch::zeros({4})), c10::Error);

  // Later offers do not displace an earlier one within the last few.
  auto h = torch::randn({2, 3});
  offer_column_sums(h, sums);
  offer_column_sums(torch::randn({2, 3}), sums * 2);
  EXPECT_TRUE(torch::equal(offered_column_sums(h), sums));
}

// Linear, the MLP and the pair take an offered sum of their output's
// gradient as their bias gradient (here a marker unlike the true sum), and
// sum it themselves when none is offered.
TEST(LinearTest, BiasGradientTakesTheOfferedSumOfTheOutputGradient) {
  torch::manual_seed(11);
  const auto x = torch::randn({6, 4});
  const auto up = torch::randn({6, 3}), marker = torch::tensor({7.0f, -8.0f, 9.0f});
  const auto param = [](at::IntArrayRef shape) { return torch::randn(shape).requires_grad_(true); };
  for (const bool offered : {false, true}) {
    SCOPED_TRACE(offered ? "offered" : "not offered");
    auto w = param({3, 4}), b = param({3});
    const auto before = offered_column_sums_used();
    if (offered) offer_column_sums(up, marker);
    torch::autograd::backward({linear(x, w, b)}, {up});
    EXPECT_TRUE(torch::allclose(b.grad(), offered ? marker : up.sum(0))) << b.grad();
    EXPECT_EQ(offered_column_sums_used() - before, offered ? 1 : 0);
    EXPECT_FALSE(offered_column_sums(up).defined());  // taken, so withdrawn

    auto w1 = param({5, 4}), b1 = param({5}), w2 = param({3, 5}), b2 = param({3});
    const auto up2 = up * 2;
    if (offered) offer_column_sums(up2, marker);
    torch::autograd::backward({gelu_mlp(x, w1, b1, w2, b2)}, {up2});
    EXPECT_TRUE(torch::allclose(b2.grad(), offered ? marker : up2.sum(0))) << b2.grad();
    EXPECT_EQ(offered_column_sums_used() - before, offered ? 2 : 0);  // b2's; b1 sums its own

    auto wa = param({3, 4}), ba = param({3}), wb = param({3, 4}), bb = param({3});
    const auto upb = up * 3;
    if (offered) offer_column_sums(upb, marker);
    const auto pair = linear_pair(x, wa, ba, wb, bb);
    torch::autograd::backward({pair.first, pair.second}, {up, upb});
    EXPECT_TRUE(torch::allclose(ba.grad(), up.sum(0)));  // up's offer was taken above
    EXPECT_TRUE(torch::allclose(bb.grad(), offered ? marker : upb.sum(0))) << bb.grad();
  }
}

}  // namespace
}  // namespace slipstream::aero
