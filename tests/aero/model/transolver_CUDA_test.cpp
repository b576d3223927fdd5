// LayerNorm in bf16 on the GPU (run by scripts/gpu_check.sh; skipped
// without CUDA): the fused kernels against fp32 at::layer_norm, the ATen
// fallback's dtype rules, and the whole Transolver with the bf16 LayerNorm
// against autocast's own fp32 LayerNorm, both measured against fp32. Also
// the bias gradient's column-sum kernels against an fp64 sum.
#include "aero/model/transolver/transolver.h"
#include "aero/ops/fused_layer_norm.h"
#include "aero/ops/linear.h"
#include "aero/ops/numerics.h"
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
#include <vector>

namespace slipstream::aero {
namespace {

using testing::relative_error;

// linear on CUDA in bf16 with widths that are not multiples of 8 (the
// models' first Linears on 3 and 7 features, the last on 5 outputs), which
// linear.cpp pads with zero columns for cuBLASLt: the output and every
// gradient against the fp32 product within bf16 rounding, and the output
// against ATen's own bf16 at::linear as closely.
TEST(LinearCudaTest, WidthsNotMultiplesOf8MatchTheFp32Product_CUDA) {
  SKIP_WITHOUT_CUDA();
  for (const auto& [in, out] :
       std::vector<std::pair<int64_t, int64_t>>{{7, 512}, {3, 256}, {448, 5}, {13, 21}}) {
    torch::manual_seed(in * 100 + out);
    const auto opts = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
    const auto x0 = torch::randn({1, 20001, in}, opts);
    const auto w0 = torch::randn({out, in}, opts) / std::sqrt(static_cast<double>(in));
    const auto b0 = torch::randn({out}, opts) * 0.1;
    const auto up = torch::randn({1, 20001, out}, opts);
    auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    auto b = b0.clone().requires_grad_(true);
    const auto y = linear(x, w, b);
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{1, 20001, out}));
    (y.to(torch::kFloat) * up.to(torch::kFloat)).sum().backward();
    auto xr = x0.to(torch::kFloat).requires_grad_(true);
    auto wr = w0.to(torch::kFloat).requires_grad_(true);
    auto br = b0.to(torch::kFloat).requires_grad_(true);
    const auto yr = torch::nn::functional::linear(xr, wr, br);
    (yr * up.to(torch::kFloat)).sum().backward();
    const double ey = relative_error(y.to(torch::kFloat), yr);
    const double eaten = relative_error(at::linear(x0, w0, b0).to(torch::kFloat), yr);
    const double ex = relative_error(x.grad().to(torch::kFloat), xr.grad());
    const double ew = relative_error(w.grad().to(torch::kFloat), wr.grad());
    const double eb = relative_error(b.grad().to(torch::kFloat), br.grad());
    std::printf(
        "linear %ld -> %ld: relative error y %.2e (ATen bf16 %.2e), x %.2e, W %.2e, b %.2e\n",
        static_cast<long>(in), static_cast<long>(out), ey, eaten, ex, ew, eb);
    EXPECT_LT(ey, std::max(2 * eaten, 5e-3)) << in << " -> " << out;
    EXPECT_LT(ex, 1e-2) << in << " -> " << out;
    EXPECT_LT(ew, 1e-2) << in << " -> " << out;
    EXPECT_LT(eb, 1e-2) << in << " -> " << out;
  }
}

// gelu_linear on CUDA in bf16, where GELU's forward, and its backward and
// recompute, run as gelu_kernels.h's kernels, against linear(gelu(h))
// through ATen's GELU kernels: the output bitwise (the forward kernel
// computes ATen's formula in the same order) and every
// gradient within 1e-3 relative (the two GELU kernels round the same fp32
// formulas; a compiler may contract them differently). Sizes the kernel
// takes (n a multiple of 8) and one it leaves to ATen.
TEST(GeluLinearCudaTest, GeluKernelsMatchAten_CUDA) {
  SKIP_WITHOUT_CUDA();
  for (const int64_t width : {1792, 36, 3}) {
    torch::manual_seed(width);
    const auto opts = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
    const auto h0 = torch::randn({1, 20001, width}, opts) * 3;
    const auto w0 = torch::randn({448, width}, opts) * 0.05;
    const auto b0 = torch::randn({448}, opts);
    const auto up = torch::randn({1, 20001, 448}, opts);
    auto h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    auto b = b0.clone().requires_grad_(true);
    const auto y = gelu_linear(h, w, b);
    (y.to(torch::kFloat) * up.to(torch::kFloat)).sum().backward();
    auto hr = h0.clone().requires_grad_(true), wr = w0.clone().requires_grad_(true);
    auto br = b0.clone().requires_grad_(true);
    const auto yr = linear(torch::gelu(hr), wr, br);
    (yr.to(torch::kFloat) * up.to(torch::kFloat)).sum().backward();
    EXPECT_TRUE(torch::equal(y, yr)) << width;
    const double eh = relative_error(h.grad().to(torch::kFloat), hr.grad().to(torch::kFloat));
    const double ew = relative_error(w.grad().to(torch::kFloat), wr.grad().to(torch::kFloat));
    const double eb = relative_error(b.grad().to(torch::kFloat), br.grad().to(torch::kFloat));
    std::printf("gelu_linear width %ld: gradient relative error h %.2e, W %.2e, b %.2e\n",
                static_cast<long>(width), eh, ew, eb);
    EXPECT_LT(eh, 1e-3) << width;
    EXPECT_LT(ew, 1e-3) << width;
    EXPECT_LT(eb, 1e-3) << width;
  }
}

// Every finite bf16 through both GELU paths of linear.h (gelu_linear's
// forward and backward kernels, gelu_mlp's backward with the bias sums),
// against ATen's at::gelu and at::gelu_backward on the GPU, bitwise: the
// kernels read gelu and gelu' from tables for most inputs and compute the
// rest, and either way must give ATen's values. Identity weights and zero
// biases make each GEMM pass its operand through exactly (one product by
// 1 in fp32), so the outputs and the input gradients are the GELU's own
// (inf and NaN are left out: a product by 0 would spread them).
TEST(GeluLinearCudaTest, EveryFiniteBf16MatchesAtenBitwise_CUDA) {
  SKIP_WITHOUT_CUDA();
  constexpr int64_t kWidth = 256;
  const auto dev = torch::Device(torch::kCUDA);
  auto codes = torch::arange(-32768, 32768, torch::dtype(torch::kInt).device(dev));
  const auto finite_code = ((codes & 0x7f80) != 0x7f80);  // exponent not all ones
  codes = codes.masked_select(finite_code).to(torch::kShort);
  const int64_t n = codes.numel() / kWidth * kWidth;
  ASSERT_EQ(n, 65280);  // 2^16 less the 256 codes of inf and NaN
  const auto x0 = codes.slice(0, 0, n).view(torch::kBFloat16).reshape({n / kWidth, kWidth});
  ASSERT_TRUE(torch::isfinite(x0).all().item<bool>());
  torch::manual_seed(7);
  const auto bf = torch::dtype(torch::kBFloat16).device(dev);
  const auto dy = torch::randn({n / kWidth, kWidth}, bf) * 4;
  const auto eye = torch::eye(kWidth, bf), zero = torch::zeros({kWidth}, bf);
  const auto want_y = at::gelu(x0), want_g = at::gelu_backward(dy, x0);
  // Mismatches: values differ, except that two magnitudes below FLT_MIN
  // count as equal (a GEMM may flush subnormals to zero).
  const auto same = [](const torch::Tensor& a, const torch::Tensor& b) {
    const auto tiny = [](const torch::Tensor& t) {
      return t.to(torch::kFloat).abs() < 1.1754944e-38;
    };
    const auto hit = (a == b) | (tiny(a) & tiny(b));
    return (~hit).sum().item<int64_t>();
  };
  {
    auto x = x0.clone().requires_grad_(true);
    const auto y = gelu_linear(x, eye, zero);
    y.backward(dy);
    EXPECT_EQ(same(y, want_y), 0) << "gelu_linear: outputs unlike at::gelu's";
    EXPECT_EQ(same(x.grad(), want_g), 0) << "gelu_linear: gradients unlike at::gelu_backward's";
  }
  {
    auto x = x0.clone().requires_grad_(true);
    auto b1 = zero.clone().requires_grad_(true);
    const auto y = gelu_mlp(x, eye, b1, eye, zero);
    y.backward(dy);
    EXPECT_EQ(same(y, want_y), 0) << "gelu_mlp: outputs unlike at::gelu's";
    EXPECT_EQ(same(x.grad(), want_g), 0) << "gelu_mlp: gradients unlike at::gelu_backward's";
    const auto sums = want_g.to(torch::kFloat).sum(0);
    EXPECT_LT(relative_error(b1.grad().to(torch::kFloat), sums), 1e-2);
  }
}

// gelu_mlp on CUDA in bf16, whose backward sums b1's gradient in the GELU
// pass (width 1792; 36 falls back to a separate sum), against linear then
// gelu_linear: the output bitwise, every gradient within 1e-3 relative.
TEST(GeluLinearCudaTest, GeluMlpSumsTheBiasGradientInTheGeluPass_CUDA) {
  SKIP_WITHOUT_CUDA();
  for (const int64_t hidden : {1792, 36}) {
    torch::manual_seed(hidden + 1);
    const auto opts = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
    const auto x0 = torch::randn({1, 20001, 448}, opts);
    const auto w10 = torch::randn({hidden, 448}, opts) * 0.05, b10 = torch::randn({hidden}, opts);
    const auto w20 = torch::randn({448, hidden}, opts) * 0.05, b20 = torch::randn({448}, opts);
    const auto up = torch::randn({1, 20001, 448}, opts).to(torch::kFloat);
    const auto leaf = [](const torch::Tensor& t) { return t.clone().requires_grad_(true); };
    auto x = leaf(x0), w1 = leaf(w10), b1 = leaf(b10), w2 = leaf(w20), b2 = leaf(b20);
    const auto y = gelu_mlp(x, w1, b1, w2, b2);
    (y.to(torch::kFloat) * up).sum().backward();
    auto xr = leaf(x0), w1r = leaf(w10), b1r = leaf(b10), w2r = leaf(w20), b2r = leaf(b20);
    const auto yr = gelu_linear(linear(xr, w1r, b1r), w2r, b2r);
    (yr.to(torch::kFloat) * up).sum().backward();
    EXPECT_TRUE(torch::equal(y, yr)) << hidden;
    const std::vector<std::pair<const char*, std::pair<torch::Tensor, torch::Tensor>>> grads = {
        {"x", {x.grad(), xr.grad()}},
        {"W1", {w1.grad(), w1r.grad()}},
        {"b1", {b1.grad(), b1r.grad()}},
        {"W2", {w2.grad(), w2r.grad()}},
        {"b2", {b2.grad(), b2r.grad()}}};
    for (const auto& [name, pair] : grads) {
      const double e = relative_error(pair.first.to(torch::kFloat), pair.second.to(torch::kFloat));
      std::printf("gelu_mlp hidden %ld: gradient relative error %s %.2e\n",
                  static_cast<long>(hidden), name, e);
      EXPECT_LT(e, 1e-3) << hidden << " " << name;
    }
  }
}

// gelu_mlp's keep_gelu on CUDA in bf16: the backward's GELU pass then
// writes no gelu(h) and the weight gradient reads the forward's; both
// GELU kernels give ATen's values bitwise, so output and every gradient
// equal the recomputing form's (to 1e-6: cuBLASLt's split-K weight
// gradients need not repeat bitwise).
TEST(GeluLinearCudaTest, GeluMlpKeepingGeluGivesTheRecomputedGradients_CUDA) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(9);
  const auto opts = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  const auto x0 = torch::randn({1, 20001, 448}, opts), r0 = torch::randn({1, 20001, 448}, opts);
  const auto w10 = torch::randn({1792, 448}, opts) * 0.05, b10 = torch::randn({1792}, opts);
  const auto w20 = torch::randn({448, 1792}, opts) * 0.03, b20 = torch::randn({448}, opts);
  const auto up = torch::randn({1, 20001, 448}, opts);
  std::vector<std::vector<torch::Tensor>> got;
  for (const bool keep : {false, true}) {
    std::vector<torch::Tensor> p;
    for (const auto& t : {x0, w10, b10, w20, b20}) p.push_back(t.clone().requires_grad_(true));
    const auto y = gelu_mlp(p[0], p[1], p[2], p[3], p[4], r0, keep);
    (y.to(torch::kFloat) * up.to(torch::kFloat)).sum().backward();
    got.push_back({y.detach()});
    for (const auto& t : p) got.back().push_back(t.grad());
  }
  for (size_t i = 0; i < got[0].size(); ++i) {
    EXPECT_LE(relative_error(got[1][i].to(torch::kFloat), got[0][i].to(torch::kFloat)), 1e-6)
        << "tensor " << i << " (0: the output)";
  }
}

TEST(LayerNormInAutocastDtypeTest, StaysInBf16UnderAutocastOnly_CUDA) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(5);
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  const auto x = torch::randn({3, 1000, 256}, opts) * 3 + 1;
  const auto w = 1 + 0.2 * torch::randn({256}, opts), b = 0.2 * torch::randn({256}, opts);
  const auto want = torch::layer_norm(x, {256}, w, b, 1e-5);
  {
    AutocastGuard autocast(x.device(), true);
    const auto y = layer_norm_in_autocast_dtype(x.to(torch::kBFloat16), {256}, w, b, 1e-5);
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
    // bf16 input and weights, fp32 statistics: a few bf16 roundings.
    EXPECT_LT(relative_error(y, want), 1e-2);
    // An fp32 input takes autocast's rule (fp32 layer norm).
    EXPECT_EQ(layer_norm_in_autocast_dtype(x, {256}, w, b, 1e-5).scalar_type(), torch::kFloat);
  }
  // Without autocast: plain at::layer_norm.
  EXPECT_TRUE(torch::equal(layer_norm_in_autocast_dtype(x, {256}, w, b, 1e-5), want));
}

// column_sum on CUDA bf16 (the kernels for widths a multiple of 8 up to
// 2048, ATen's wide-view sum otherwise) against fp64: the same result to
// fp32 rounding, for row counts that leave partial sweeps and blocks, and
// the same bits on a second call (no atomics).
TEST(ColumnSumCudaTest, MatchesFp64SumAndRepeatsBitwise_CUDA) {
  SKIP_WITHOUT_CUDA();
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  for (const int64_t width : {8, 40, 256, 1000, 1024, 2048, 12, 4096}) {
    for (const int64_t rows : {0, 1, 33, 4099, 200003}) {
      torch::manual_seed(width * 7 + rows);
      const auto m = (torch::randn({rows, width}, opts) + 0.25).to(torch::kBFloat16);
      const auto s = column_sum(m);
      SCOPED_TRACE("width " + std::to_string(width) + ", rows " + std::to_string(rows));
      EXPECT_EQ(s.scalar_type(), torch::kFloat);
      ASSERT_EQ(s.sizes(), (std::vector<int64_t>{width}));
      const auto want = m.to(torch::kDouble).sum(0);
      if (rows == 0) {
        EXPECT_EQ(s.abs().max().item<float>(), 0.0f);
        continue;
      }
      EXPECT_LT(relative_error(s, want), 2e-6);
      EXPECT_TRUE(torch::equal(s, column_sum(m)));
    }
  }
}

// The kernels on the same bf16 values as an fp32 reference: output and
// input gradient within a few bf16 roundings, weight and bias gradients
// (summed in fp32) much closer. Row counts include odd ones (the forward
// takes rows two at a time).
TEST(FusedLayerNormCudaTest, MatchesFp32LayerNormForwardAndBackward_CUDA) {
  SKIP_WITHOUT_CUDA();
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  for (const int64_t width : {256, 512, 768, 1024, 64, 192, 448, 960}) {
    for (const int64_t rows : {1, 3, 1001, 20000}) {
      torch::manual_seed(width + rows);
      const auto x = (torch::randn({1, rows, width}, opts) * 2 + 0.5).to(torch::kBFloat16);
      const auto gy = torch::randn({1, rows, width}, opts).to(torch::kBFloat16);
      const auto w = 1 + 0.3 * torch::randn({width}, opts), b = 0.3 * torch::randn({width}, opts);
      ASSERT_TRUE(layer_norm_kernels_apply(x, w, b)) << width;

      auto xf = x.clone().requires_grad_(true);
      auto wf = w.clone().requires_grad_(true), bf = b.clone().requires_grad_(true);
      const auto y = fused_layer_norm(xf, {width}, wf, bf, 1e-5);
      y.backward(gy);
      auto xr = x.to(torch::kFloat).requires_grad_(true);
      auto wr = w.clone().requires_grad_(true), br = b.clone().requires_grad_(true);
      const auto yr = torch::layer_norm(xr, {width}, wr, br, 1e-5);
      yr.backward(gy.to(torch::kFloat));

      SCOPED_TRACE("width " + std::to_string(width) + ", rows " + std::to_string(rows));
      EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
      EXPECT_EQ(xf.grad().scalar_type(), torch::kBFloat16);
      EXPECT_EQ(wf.grad().scalar_type(), torch::kFloat);
      const double ey = relative_error(y, yr), ex = relative_error(xf.grad(), xr.grad());
      const double ew = relative_error(wf.grad(), wr.grad()),
                   eb = relative_error(bf.grad(), br.grad());
      if (rows == 20000) {
        std::printf("layer norm width %ld: y %.2e, grad x %.2e, grad w %.2e, grad b %.2e\n",
                    static_cast<long>(width), ey, ex, ew, eb);
      }
      EXPECT_LT(ey, 8e-3);
      EXPECT_LT(ex, 8e-3);
      EXPECT_LT(ew, 1e-4);
      EXPECT_LT(eb, 1e-4);
    }
  }
}

// The residual form, y = f(norm) + r with {norm, r} = fused_layer_norm_residual(x):
// the same norm, bitwise, as fused_layer_norm; r is x; and x's gradient,
// the residual's and the norm's summed inside the LayerNorm's backward
// kernel, matches the two-op form (autograd adding the two) to bf16
// rounding, the parameter gradients to fp32 round-off. A residual with no
// gradient (r unused) and a norm with none (norm unused) both work.
TEST(FusedLayerNormCudaTest, ResidualFormAddsBothGradientsInOneKernel_CUDA) {
  SKIP_WITHOUT_CUDA();
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  for (const int64_t width : {448, 256}) {
    for (const int64_t rows : {3, 20001}) {
      torch::manual_seed(width * 3 + rows);
      const auto x = (torch::randn({1, rows, width}, opts) * 2 + 0.5).to(torch::kBFloat16);
      const auto gn = torch::randn({1, rows, width}, opts).to(torch::kBFloat16);
      const auto gr = torch::randn({1, rows, width}, opts).to(torch::kBFloat16);
      const auto w = 1 + 0.3 * torch::randn({width}, opts), b = 0.3 * torch::randn({width}, opts);
      SCOPED_TRACE("width " + std::to_string(width) + ", rows " + std::to_string(rows));
      for (int use = 0; use < 3; ++use) {  // both, the norm alone, the residual alone
        torch::Tensor got[3], want[3], y_got, y_want;
        for (int fused = 0; fused < 2; ++fused) {
          auto xi = x.clone().requires_grad_(true);
          auto wi = w.clone().requires_grad_(true), bi = b.clone().requires_grad_(true);
          torch::Tensor norm, residual;
          if (fused == 1) {
            std::tie(norm, residual) = fused_layer_norm_residual(xi, {width}, wi, bi, 1e-5);
            y_got = norm.detach();
            EXPECT_TRUE(torch::equal(residual.detach(), x));
          } else {
            norm = fused_layer_norm(xi, {width}, wi, bi, 1e-5);
            residual = xi;
            y_want = norm.detach();
          }
          auto loss = torch::zeros({}, opts);
          if (use != 2) loss = loss + (norm.to(torch::kFloat) * gn.to(torch::kFloat)).sum();
          if (use != 1) loss = loss + (residual.to(torch::kFloat) * gr.to(torch::kFloat)).sum();
          loss.backward();
          auto& out = fused == 1 ? got : want;
          out[0] = xi.grad();
          out[1] = wi.grad().defined() ? wi.grad() : torch::zeros_like(w);
          out[2] = bi.grad().defined() ? bi.grad() : torch::zeros_like(b);
        }
        SCOPED_TRACE("use " + std::to_string(use));
        EXPECT_TRUE(torch::equal(y_got, y_want));
        EXPECT_EQ(got[0].scalar_type(), torch::kBFloat16);
        EXPECT_LT(relative_error(got[0], want[0]), 8e-3);
        EXPECT_LT(relative_error(got[1], want[1]), 1e-5);
        EXPECT_LT(relative_error(got[2], want[2]), 1e-5);
        if (use == 2) {
          EXPECT_TRUE(torch::equal(got[0], gr));  // nothing but the residual's
        }
      }
    }
  }
}

// The backward also sums x's gradient over rows (bf16 values as stored) and
// offers the sums to the Linear that made x: its bias gradient is then
// that sum, within fp32 summation order of column_sum's; and a Linear
// whose output also goes elsewhere (autograd sums the two gradients) sums
// its own.
TEST(FusedLayerNormCudaTest, BackwardSumsTheInputGradientForTheLinearBefore_CUDA) {
  SKIP_WITHOUT_CUDA();
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  for (const int64_t width : {448, 256}) {
    for (const bool residual : {false, true}) {
      for (const bool shared : {false, true}) {
        SCOPED_TRACE("width " + std::to_string(width) + (residual ? ", residual" : "") +
                     (shared ? ", output also used elsewhere" : ""));
        torch::manual_seed(width + residual * 2 + shared);
        const int64_t rows = 20001;
        const auto x = torch::randn({1, rows, width}, opts).to(torch::kBFloat16);
        auto w = (0.05 * torch::randn({width, width}, opts)).requires_grad_(true);
        auto b = torch::randn({width}, opts).requires_grad_(true);
        const auto lw = 1 + 0.3 * torch::randn({width}, opts),
                   lb = 0.3 * torch::randn({width}, opts);
        const auto gn = torch::randn({1, rows, width}, opts).to(torch::kBFloat16);
        const auto gr = torch::randn({1, rows, width}, opts).to(torch::kBFloat16);
        const auto before = offered_column_sums_used();
        torch::Tensor y;
        {
          AutocastGuard autocast(x.device(), true);
          y = linear(x, w, b);
        }
        ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
        auto yl = y.detach().requires_grad_(true);  // the gradient y gets, to check against
        // The LayerNorm's part of the loss, of its input t.
        const auto ln_loss_of = [&](const torch::Tensor& t) {
          const auto dot = [](const torch::Tensor& a, const torch::Tensor& g) {
            return (a.to(torch::kFloat) * g.to(torch::kFloat)).sum();
          };
          if (!residual) return dot(fused_layer_norm(t, {width}, lw, lb, 1e-5), gn);
          auto [norm, res] = fused_layer_norm_residual(t, {width}, lw, lb, 1e-5);
          return dot(norm, gn) + dot(res, gr);
        };
        torch::Tensor loss = ln_loss_of(y);
        if (shared) loss = loss + (y.to(torch::kFloat) * gr.to(torch::kFloat)).sum();
        // y's gradient as the LayerNorm makes it, summed apart in fp64.
        torch::Tensor gy;
        {
          ln_loss_of(yl).backward();
          gy = yl.grad();
          if (shared) gy = gy + gr;  // as autograd adds the two, in bf16
          gy = gy.to(torch::kDouble);
        }
        const auto used_by_check = offered_column_sums_used();
        EXPECT_EQ(used_by_check, before);  // yl is a leaf: no Linear took it
        loss.backward();
        EXPECT_EQ(offered_column_sums_used() - used_by_check, shared ? 0 : 1);
        const auto want = gy.reshape({rows, width}).sum(0);
        EXPECT_EQ(b.grad().scalar_type(), torch::kFloat);
        EXPECT_LT(relative_error(b.grad(), want.to(torch::kFloat)), 1e-5);
      }
    }
  }
}

// A width the kernels do not take runs the ATen fallback, still in bf16.
TEST(FusedLayerNormCudaTest, OtherWidthsFallBackToAten_CUDA) {
  SKIP_WITHOUT_CUDA();
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  const auto x = torch::randn({1, 100, 96}, opts).to(torch::kBFloat16);
  const auto w = torch::ones({96}, opts), b = torch::zeros({96}, opts);
  EXPECT_FALSE(layer_norm_kernels_apply(x, w, b));
  AutocastGuard autocast(x.device(), true);
  const auto y = fused_layer_norm(x, {96}, w, b, 1e-5);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_LT(relative_error(y, torch::layer_norm(x.to(torch::kFloat), {96}, w, b, 1e-5)), 8e-3);
}

struct Result {
  torch::Tensor out;
  std::map<std::string, torch::Tensor> grads;
};

Result step(Transolver& m, const torch::Tensor& emb, const torch::Tensor& fx,
            const torch::Tensor& upstream, bool bf16, bool bf16_ln) {
  for (auto& block : *m->blocks) block->as<TransolverBlock>()->bf16_layer_norm = bf16_ln;
  m->zero_grad();
  Result r;
  {
    AutocastGuard autocast(emb.device(), bf16);
    r.out = m->forward(emb, fx).to(torch::kFloat);
  }
  (r.out * upstream).sum().backward();
  for (const auto& p : m->named_parameters()) r.grads[p.key()] = p.value().grad().clone();
  return r;
}

// Three layers of the volume widths (fused attention on), LayerNorm weights
// and biases away from 1 and 0 so that rounding them to bf16 shows. The bf16
// LayerNorm's output and every gradient must stay within 3x autocast's own
// error against fp32, or 2e-2 relative.
TEST(TransolverCudaTest, Bf16LayerNormWithinAutocastTolerance_CUDA) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(7);
  TransolverOptions o;
  o.n_layers = 3;
  Transolver m(o);
  {
    torch::NoGradGuard no_grad;
    for (auto& mod : m->modules(false)) {
      if (auto* ln = mod->as<torch::nn::LayerNorm>()) {
        ln->weight.normal_(1.0, 0.3);
        ln->bias.normal_(0.0, 0.3);
      }
    }
  }
  m->to(torch::kCUDA);
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  const int64_t n = 6001;
  const auto emb = torch::randn({1, n, 7}, opts), fx = torch::randn({1, n, 3}, opts);
  const auto upstream = torch::randn({1, n, o.out_dim}, opts);
  const auto ref = step(m, emb, fx, upstream, false, false);
  const auto fp32_ln = step(m, emb, fx, upstream, true, false);
  const auto bf16_ln = step(m, emb, fx, upstream, true, true);
  const double out_a = relative_error(fp32_ln.out, ref.out),
               out_b = relative_error(bf16_ln.out, ref.out);
  std::printf("output: autocast fp32 LN %.2e, bf16 LN %.2e\n", out_a, out_b);
  EXPECT_LE(out_b, std::max(3 * out_a, 2e-2));
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, want] : ref.grads) {
    const double a = relative_error(fp32_ln.grads.at(name), want),
                 b = relative_error(bf16_ln.grads.at(name), want);
    EXPECT_TRUE(torch::isfinite(bf16_ln.grads.at(name)).all().item<bool>()) << name;
    EXPECT_LE(b, std::max(3 * a, 2e-2)) << name << ": fp32 LN " << a << ", bf16 LN " << b;
    if (b - a > worst) {
      worst = b - a;
      worst_name = name;
    }
    if (name.find("ln") != std::string::npos || name.find("blocks.0.Attn.in_project_x") == 0) {
      std::printf("  grad %-34s fp32 LN %.2e bf16 LN %.2e\n", name.c_str(), a, b);
    }
  }
  std::printf("largest excess of bf16 LN over fp32 LN: %s (+%.2e)\n", worst_name.c_str(), worst);
}

}  // namespace
}  // namespace slipstream::aero
