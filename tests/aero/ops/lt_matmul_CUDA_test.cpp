// cuBLASLt's epilogue on the GPU (run by scripts/gpu_check.sh; skipped
// without CUDA): the residual added in a Linear's GEMM against fp32 and
// against the two ops it replaces, in values and through autograd; that it
// applies at the models' shapes (so the fast path is the one measured); and
// that it declines what it does not take; fp32 weight gradients made in
// fp32; mm(), the tuned GEMM linear.cpp runs its products on, against fp32
// in every operand layout, accumulating, in fp32, with a bias, and first
// used inside a CUDA graph capture.
#include "aero/ops/linear.h"
#include "aero/ops/lt_matmul.h"
#include "core/device/cuda_graph.h"
#include "core/device/device.h"

#include "support/cuda_skip.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

namespace slipstream::aero {
namespace {

using testing::relative_error;

// The cuBLASLt path itself (the heuristic's pick: tuned, ATen may take a
// problem over) while alive.
struct ModeGuard {
  lt_matmul::Mode old = lt_matmul::mode();
  explicit ModeGuard(lt_matmul::Mode m) { lt_matmul::set_mode(m); }
  ~ModeGuard() { lt_matmul::set_mode(old); }
};

torch::TensorOptions bf16_cuda() { return torch::dtype(torch::kBFloat16).device(torch::kCUDA); }

// out_linear (448 -> 448) and the MLP's second Linear (1792 -> 448) of the
// GeoTransolver volume config, at row counts that are not multiples of any
// tile (1, 4099) and at the model's 200k.
TEST(LtMatmulCudaTest, LinearResidualRoundsTheSumOnce_CUDA) {
  SKIP_WITHOUT_CUDA();
  for (const int64_t in : {448, 1792}) {
    for (const int64_t rows : {1, 4099, 200000}) {
      torch::manual_seed(in + rows);
      const auto x = torch::randn({1, rows, in}, bf16_cuda());
      const auto w = torch::randn({448, in}, bf16_cuda()) * (1.0 / std::sqrt(double(in)));
      const auto b = torch::randn({448}, bf16_cuda());
      const auto r = torch::randn({1, rows, 448}, bf16_cuda()) * 4;
      at::Tensor y;
      ASSERT_TRUE(lt_matmul::linear_residual(x, w, b, r, y)) << in << " " << rows;
      ASSERT_EQ(y.sizes(), r.sizes());
      ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
      const auto want = torch::matmul(x.to(torch::kFloat), w.to(torch::kFloat).t()) +
                        b.to(torch::kFloat) + r.to(torch::kFloat);
      const auto apart = at::linear(x, w, b) + r;  // two bf16 roundings
      const double fused_err = relative_error(y.to(torch::kFloat), want);
      const double apart_err = relative_error(apart.to(torch::kFloat), want);
      std::printf("linear_residual in %ld rows %ld: relative error %.2e (apart %.2e)\n",
                  static_cast<long>(in), static_cast<long>(rows), fused_err, apart_err);
      // One bf16 rounding of the sum (2^-9 relative at most, ~2^-10 rms).
      EXPECT_LT(fused_err, 2e-3) << in << " " << rows;
      EXPECT_LE(fused_err, apart_err * 1.01) << in << " " << rows;
    }
  }
}

TEST(LtMatmulCudaTest, DeclinesWhatItDoesNotTake_CUDA) {
  SKIP_WITHOUT_CUDA();
  const auto x = torch::randn({64, 448}, bf16_cuda()), w = torch::randn({448, 448}, bf16_cuda());
  const auto b = torch::randn({448}, bf16_cuda()), r = torch::randn({64, 448}, bf16_cuda());
  at::Tensor y;
  ASSERT_TRUE(lt_matmul::linear_residual(x, w, b, r, y));
  y = at::Tensor();
  EXPECT_FALSE(lt_matmul::linear_residual(x.cpu(), w.cpu(), b.cpu(), r.cpu(), y));
  EXPECT_FALSE(lt_matmul::linear_residual(x.to(torch::kFloat), w, b, r, y));
  EXPECT_FALSE(lt_matmul::linear_residual(x, w, b, r.to(torch::kFloat), y));
  EXPECT_FALSE(lt_matmul::linear_residual(x, w, b, r.t().contiguous().t(), y));  // strided
  EXPECT_FALSE(lt_matmul::linear_residual(torch::randn({64, 36}, bf16_cuda()),
                                          torch::randn({448, 36}, bf16_cuda()), b, r, y));
  EXPECT_FALSE(y.defined());
}

// Through autograd, as the models call them: linear_residual and gelu_mlp
// with a residual against the same functions without it plus the add.
TEST(LtMatmulCudaTest, ResidualFormsMatchTheAddInValuesAndGradients_CUDA) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(11);
  const int64_t rows = 20001;
  const auto leaf = [](const torch::Tensor& t) { return t.clone().requires_grad_(true); };
  const auto x0 = torch::randn({1, rows, 448}, bf16_cuda());
  const auto r0 = torch::randn({1, rows, 448}, bf16_cuda());
  const auto w10 = torch::randn({1792, 448}, bf16_cuda()) * 0.05;
  const auto b10 = torch::randn({1792}, bf16_cuda());
  const auto w20 = torch::randn({448, 1792}, bf16_cuda()) * 0.02;
  const auto b20 = torch::randn({448}, bf16_cuda());
  const auto wo0 = torch::randn({448, 448}, bf16_cuda()) * 0.05;  // out_linear's shape
  const auto up = torch::randn({1, rows, 448}, bf16_cuda()).to(torch::kFloat);
  for (const bool mlp : {false, true}) {
    const std::vector<torch::Tensor> start{x0, r0, w10, b10, w20, b20, wo0};
    std::vector<torch::Tensor> fused, apart;
    for (const auto& t : start) {
      fused.push_back(leaf(t));
      apart.push_back(leaf(t));
    }
    const auto run = [&](std::vector<torch::Tensor>& p, bool with_residual) {
      const auto &x = p[0], &r = p[1], &w1 = p[2], &b1 = p[3], &w2 = p[4], &b2 = p[5], &wo = p[6];
      torch::Tensor y;
      if (mlp) {
        y = with_residual ? gelu_mlp(x, w1, b1, w2, b2, r) : gelu_mlp(x, w1, b1, w2, b2) + r;
      } else {
        y = with_residual ? linear_residual(x, wo, b2, r) : linear(x, wo, b2) + r;
      }
      (y.to(torch::kFloat) * up).sum().backward();
      return y.detach();
    };
    const auto yf = run(fused, true), ya = run(apart, false);
    const double y_err = relative_error(yf.to(torch::kFloat), ya.to(torch::kFloat));
    std::printf("%s residual: output relative error %.2e\n", mlp ? "gelu_mlp" : "linear", y_err);
    EXPECT_LT(y_err, 4e-3) << mlp;  // one bf16 rounding apart at most
    const char* names[] = {"x", "r", "W1", "b1", "W2", "b2", "Wo"};
    for (size_t i = 0; i < fused.size(); ++i) {
      if (!apart[i].grad().defined()) {
        EXPECT_FALSE(fused[i].grad().defined()) << names[i];
        continue;
      }
      ASSERT_TRUE(fused[i].grad().defined()) << names[i];
      const double e =
          relative_error(fused[i].grad().to(torch::kFloat), apart[i].grad().to(torch::kFloat));
      std::printf("%s residual: gradient relative error %s %.2e\n", mlp ? "gelu_mlp" : "linear",
                  names[i], e);
      EXPECT_LT(e, 4e-3) << mlp << " " << names[i];
    }
    // The residual's gradient is the output's, as for an add.
    EXPECT_TRUE(torch::equal(fused[1].grad(), apart[1].grad())) << mlp;
  }
}

// An fp32 weight's gradient under bf16 autocast, as the trainer runs the
// models: cuBLASLt writes it in fp32 from the bf16 operands (no bf16
// rounding of the product before the cast), for the Linear shapes of the
// GeoTransolver volume layer, both wider and narrower than they are tall.
// Against the fp64 product of the same bf16 operands it is within fp32
// summation error (4.3e-6 to 7.4e-6 on an H200 at 20001 rows); a product
// rounded to bf16 first is ~1e-3 off (bf16's rounding, 2^-9 / sqrt(3) rms).
TEST(LtMatmulCudaTest, Fp32WeightGradientsAreNotRoundedToBf16_CUDA) {
  SKIP_WITHOUT_CUDA();
  const ModeGuard heuristic(lt_matmul::Mode::heuristic);  // tuned, ATen may win
  torch::manual_seed(5);
  const int64_t rows = 20001;
  for (const auto& [out, in] :
       std::vector<std::pair<int64_t, int64_t>>{{448, 448}, {1792, 448}, {448, 1792}}) {
    const auto x = torch::randn({1, rows, in}, bf16_cuda());
    const auto w = (torch::randn({out, in}, torch::device(torch::kCUDA)) * 0.05).requires_grad_();
    const auto b = torch::randn({out}, torch::device(torch::kCUDA)).requires_grad_();
    const auto up = torch::randn({1, rows, out}, bf16_cuda());
    {
      AutocastGuard autocast(x.device(), true);
      (linear(x, w, b) * up).sum().backward();
    }
    ASSERT_EQ(w.grad().scalar_type(), torch::kFloat);
    // The output's gradient is up, in bf16 (the product's dtype).
    const auto want =
        up.reshape({rows, out}).to(torch::kDouble).t().mm(x.reshape({rows, in}).to(torch::kDouble));
    const double e = relative_error(w.grad().to(torch::kDouble), want);
    std::printf("fp32 weight gradient %lld x %lld: relative error %.2e against fp64\n",
                static_cast<long long>(out), static_cast<long long>(in), e);
    EXPECT_LT(e, 1e-4) << out << " x " << in;
  }
}

// a (rows, inner) b (inner, cols) in each layout linear.cpp hands over
// (b a transposed view of a contiguous (cols, inner), a of (inner, rows)),
// against the fp32 product: the result is that product rounded once.
TEST(LtMatmulCudaTest, MmMatchesTheFp32ProductInEveryLayout_CUDA) {
  SKIP_WITHOUT_CUDA();
  const ModeGuard lt(lt_matmul::Mode::heuristic);
  struct Shape {
    int64_t rows, inner, cols;
  };
  for (const auto& s : {Shape{4099, 448, 448}, Shape{200000, 448, 1792}, Shape{448, 20000, 256},
                        Shape{1, 32, 256}}) {
    for (const bool at : {false, true}) {
      for (const bool bt : {false, true}) {
        torch::manual_seed(s.rows + s.inner + s.cols + 2 * at + bt);
        const auto a = at ? torch::randn({s.inner, s.rows}, bf16_cuda()).t()
                          : torch::randn({s.rows, s.inner}, bf16_cuda());
        const auto b = bt ? torch::randn({s.cols, s.inner}, bf16_cuda()).t()
                          : torch::randn({s.inner, s.cols}, bf16_cuda());
        const auto want = torch::mm(a.to(torch::kFloat), b.to(torch::kFloat));
        at::Tensor y, y32;
        if (s.rows % 8 != 0 && at) continue;  // a's leading dimension must be a multiple of 8
        ASSERT_TRUE(lt_matmul::mm(a, b, {}, {}, y, torch::kBFloat16))
            << s.rows << " " << s.inner << " " << s.cols << " " << at << bt;
        ASSERT_TRUE(lt_matmul::mm(a, b, {}, {}, y32, torch::kFloat));
        ASSERT_EQ(y.sizes(), want.sizes());
        ASSERT_EQ(y32.scalar_type(), torch::kFloat);
        const double e16 = relative_error(y.to(torch::kFloat), want);
        const double e32 = relative_error(y32, want);
        std::printf("mm %ld x %ld x %ld a%c b%c: relative error bf16 %.2e fp32 %.2e\n",
                    static_cast<long>(s.rows), static_cast<long>(s.inner),
                    static_cast<long>(s.cols), at ? 'T' : 'N', bt ? 'T' : 'N', e16, e32);
        EXPECT_LT(e16, 3e-3);  // one bf16 rounding
        EXPECT_LT(e32, 3e-5);  // fp32 accumulation alone (split over K)
      }
    }
  }
}

TEST(LtMatmulCudaTest, MmAccumulatesInPlaceAndAddsTheBias_CUDA) {
  SKIP_WITHOUT_CUDA();
  const ModeGuard lt(lt_matmul::Mode::heuristic);
  torch::manual_seed(5);
  const auto a = torch::randn({20001, 448}, bf16_cuda());
  const auto b = torch::randn({448, 448}, bf16_cuda()).t().contiguous().t();
  const auto bias = torch::randn({448}, bf16_cuda());
  const auto acc0 = torch::randn({20001, 448}, bf16_cuda());
  const auto f = [](const torch::Tensor& t) { return t.to(torch::kFloat); };
  auto acc = acc0.clone();
  auto out = acc;
  const void* where = acc.data_ptr();
  ASSERT_TRUE(lt_matmul::mm(a, b, {}, acc, out, torch::kBFloat16));
  EXPECT_EQ(out.data_ptr(), where);  // in place
  EXPECT_LT(relative_error(f(acc), torch::mm(f(a), f(b)) + f(acc0)), 3e-3);
  at::Tensor y;
  ASSERT_TRUE(lt_matmul::mm(a, b, bias, {}, y, torch::kBFloat16));
  EXPECT_LT(relative_error(f(y), torch::mm(f(a), f(b)) + f(bias)), 3e-3);
  // A bias with an fp32 output, a column count not a multiple of 8, a CPU
  // operand, an fp32 operand, no unit stride: declined, out untouched.
  at::Tensor none;
  EXPECT_FALSE(lt_matmul::mm(a, b, bias, {}, none, torch::kFloat));
  EXPECT_FALSE(
      lt_matmul::mm(a, torch::randn({448, 36}, bf16_cuda()), {}, {}, none, torch::kBFloat16));
  EXPECT_FALSE(lt_matmul::mm(a.cpu(), b.cpu(), {}, {}, none, torch::kBFloat16));
  EXPECT_FALSE(lt_matmul::mm(a.to(torch::kFloat), b, {}, {}, none, torch::kBFloat16));
  EXPECT_FALSE(
      lt_matmul::mm(a.slice(1, 0, 448, 2), b.slice(0, 0, 448, 2), {}, {}, none, torch::kBFloat16));
  EXPECT_FALSE(none.defined());
}

// A problem first met inside a capture takes the heuristic's pick (nothing
// can be timed there) and replays right; the next use outside tunes it.
TEST(LtMatmulCudaTest, MmFirstUsedInACaptureReplaysTheProduct_CUDA) {
  SKIP_WITHOUT_CUDA();
  const ModeGuard lt(lt_matmul::Mode::heuristic);
  const c10::Device dev(c10::kCUDA, 0);
  ASSERT_TRUE(CudaGraph::supported(dev));
  torch::manual_seed(9);
  const auto a = torch::randn({12345 * 8, 264}, bf16_cuda());  // a shape no other test uses
  const auto b = torch::randn({264, 136}, bf16_cuda());
  at::Tensor y;
  CudaGraph graph;
  {
    const SideStreamGuard side(CudaGraph::side_stream(dev));
    // cuBLASLt's handle and this stream's workspace made outside the capture.
    at::Tensor warm;
    ASSERT_TRUE(lt_matmul::mm(b.t(), b, {}, {}, warm, torch::kBFloat16));
    graph.capture(dev, [&] {
      at::Tensor out;
      ASSERT_TRUE(lt_matmul::mm(a, b, {}, {}, out, torch::kBFloat16));
      y = out;
    });
    y.zero_();
    graph.replay();
  }
  const auto want = torch::mm(a.to(torch::kFloat), b.to(torch::kFloat));
  EXPECT_LT(relative_error(y.to(torch::kFloat), want), 3e-3);
  at::Tensor again;
  ASSERT_TRUE(lt_matmul::mm(a, b, {}, {}, again, torch::kBFloat16));
  EXPECT_LT(relative_error(again.to(torch::kFloat), want), 3e-3);
}

// Tuned, each of linear.cpp's products at the model's shapes either runs on
// the fastest cuBLASLt algorithm or is declined for ATen's, the same way
// each time, and what runs gives the product.
TEST(LtMatmulCudaTest, TunedMmKeepsItsPickAndGivesTheProduct_CUDA) {
  SKIP_WITHOUT_CUDA();
  const ModeGuard tuned(lt_matmul::Mode::tuned);
  torch::manual_seed(3);
  const int64_t rows = 200000;
  const auto x = torch::randn({rows, 448}, bf16_cuda()),
             g = torch::randn({rows, 1792}, bf16_cuda());
  const auto w = torch::randn({1792, 448}, bf16_cuda()) * 0.05;
  struct Case {
    const char* what;
    torch::Tensor a, b;
    torch::ScalarType dtype;
  };
  const Case cases[] = {{"forward x w^T", x, w.t(), torch::kBFloat16},
                        {"input gradient g w", g, w, torch::kBFloat16},
                        {"weight gradient x^T g", x.t(), g, torch::kFloat}};
  for (const auto& c : cases) {
    const auto want = torch::mm(c.a.to(torch::kFloat), c.b.to(torch::kFloat));
    at::Tensor first, second;
    const bool took = lt_matmul::mm(c.a, c.b, {}, {}, first, c.dtype);
    EXPECT_EQ(lt_matmul::mm(c.a, c.b, {}, {}, second, c.dtype), took) << c.what;
    std::printf("tuned %s: %s\n", c.what, took ? "cuBLASLt" : "ATen");
    if (!took) {
      EXPECT_FALSE(first.defined() || second.defined()) << c.what;
      continue;
    }
    EXPECT_EQ(first.scalar_type(), c.dtype) << c.what;
    EXPECT_LT(relative_error(first.to(torch::kFloat), want), 3e-3) << c.what;
    EXPECT_LT(relative_error(second.to(torch::kFloat), want), 3e-3) << c.what;
  }
}

}  // namespace
}  // namespace slipstream::aero
