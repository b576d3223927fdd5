// cuBLASLt's epilogue on the GPU (run by scripts/gpu_check.sh; skipped
// without CUDA): the residual added in a Linear's GEMM against fp32 and
// against the two ops it replaces, in values and through autograd; that it
// applies at the models' shapes (so the fast path is the one measured); and
// that it declines what it does not take.
#include "aero/model/linear.h"
#include "aero/model/lt_matmul.h"
#include "core/device/device.h"

#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

namespace slipstream::aero {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

using testing::relative_error;

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

}  // namespace
}  // namespace slipstream::aero
