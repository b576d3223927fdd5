// cuBLASLt's epilogue on the GPU (run by scripts/gpu_check.sh; skipped
// without CUDA): the residual added in a Linear's GEMM against fp32 and
// against the two ops it replaces, in values and through autograd; that it
// applies at the models' shapes (so the fast path is the one measured); and
// that it declines what it does not take; fp32 weight gradients made in
// fp32; mm(), the tuned GEMM linear.cpp runs its products on, against fp32
// in every operand layout, accumulating, in fp32, with a bias, and first
// used inside a CUDA graph capture; GELU's tanh form in the epilogues.
#include "aero/ops/linear.h"
#include "aero/ops/lt_matmul.h"
#include "core/device/cuda_graph.h"
#include "core/device/device.h"

#include "support/cuda_skip.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
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

// numerics.mlp_gelu: tanh on cuBLASLt's epilogues. lt_matmul's two
// products at the Transolver MLP's shapes (256 -> 1024 -> 256, 4099 and
// 200k rows) against fp32: h = x W1^T + b1, a = gelu_tanh(h), and
// gh = gelu_tanh'(h) (g W2) with its column sums. Then gelu_mlp through
// autograd (gelu(h) kept and recomputed, with a residual) against the ops
// apart in bf16 (at::gelu "tanh"), both measured against the fp32 ops: the
// epilogue path within one bf16 rounding of what the ops give, and run
// twice per step (the counter).
TEST(LtMatmulCudaTest, GeluTanhEpiloguesMatchTheOps_CUDA) {
  SKIP_WITHOUT_CUDA();
  const auto f32 = torch::kFloat;
  for (const int64_t rows : {4099, 200000}) {
    torch::manual_seed(rows);
    const auto x = torch::randn({rows, 256}, bf16_cuda());
    const auto w1 = torch::randn({1024, 256}, bf16_cuda()) * 0.1;
    const auto b1 = torch::randn({1024}, bf16_cuda()) * 0.5;
    at::Tensor h, a;
    ASSERT_TRUE(lt_matmul::linear_gelu_tanh(x, w1, b1, h, a)) << rows;
    const auto h32 = x.to(f32).mm(w1.to(f32).t()) + b1.to(f32);
    EXPECT_LT(relative_error(h.to(f32), h32), 4e-3) << rows;
    // a from the epilogue's fp32 h, against GELU of the bf16 h it stored.
    EXPECT_LT(relative_error(a.to(f32), torch::gelu(h32, "tanh")), 4e-3) << rows;
    const auto g = torch::randn({rows, 256}, bf16_cuda());
    const auto w2 = torch::randn({256, 1024}, bf16_cuda()) * 0.05;
    at::Tensor gh, gb;
    ASSERT_TRUE(lt_matmul::gelu_tanh_backward_mm(g, w2, h, gh, gb)) << rows;
    ASSERT_EQ(gb.numel(), 1024);
    const auto gh32 = torch::gelu_backward(g.to(f32).mm(w2.to(f32)), h.to(f32), "tanh");
    const double gh_err = relative_error(gh.to(f32), gh32);
    const double gb_err = relative_error(gb.to(f32), gh32.sum(0));
    std::printf("GELU tanh epilogues, %lld rows: h %.2e a %.2e gh %.2e gb %.2e\n",
                static_cast<long long>(rows), relative_error(h.to(f32), h32),
                relative_error(a.to(f32), torch::gelu(h32, "tanh")), gh_err, gb_err);
    EXPECT_LT(gh_err, 4e-3) << rows;
    EXPECT_LT(gb_err, 4e-3) << rows;
    at::Tensor gh2, none;
    ASSERT_TRUE(lt_matmul::gelu_tanh_backward_mm(g, w2, h, gh2, none, false)) << rows;
    EXPECT_FALSE(none.defined());
    EXPECT_TRUE(torch::equal(gh2, gh)) << rows;
    if (rows < 200000) continue;
    // What each form costs (printed, not checked): the epilogues against
    // the GEMM and the passes apart.
    const auto ms = [](const std::function<void()>& f) {
      f();
      torch::cuda::synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 20; ++i) f();
      torch::cuda::synchronize();
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                 .count() /
             20;
    };
    at::Tensor t1, t2;
    const double fwd_epi = ms([&] { lt_matmul::linear_gelu_tanh(x, w1, b1, t1, t2); });
    const double fwd_apart = ms([&] {
      lt_matmul::mm(x, w1.t(), b1, {}, t1, torch::kBFloat16);
      t2 = torch::gelu(t1, "tanh");
    });
    const double bwd_bgrad = ms([&] { lt_matmul::gelu_tanh_backward_mm(g, w2, h, t1, t2); });
    const double bwd_dgelu = ms([&] {
      lt_matmul::gelu_tanh_backward_mm(g, w2, h, t1, t2, false);
      t2 = column_sum(t1);
    });
    const double bwd_apart = ms([&] {
      lt_matmul::mm(g, w2, {}, {}, t1, torch::kBFloat16);
      t1 = torch::gelu_backward(t1, h, "tanh");
      t2 = column_sum(t1);
    });
    std::printf(
        "GELU tanh, 200k x 256 -> 1024: forward epilogue %.3f ms, GEMM + GELU %.3f; "
        "backward DGELU_BGRAD %.3f, DGELU + column_sum %.3f, GEMM + GELU' + column_sum "
        "%.3f\n",
        fwd_epi, fwd_apart, bwd_bgrad, bwd_dgelu, bwd_apart);
  }

  struct Tanh {
    Tanh() { set_mlp_gelu_tanh(true); }
    ~Tanh() { set_mlp_gelu_tanh(false); }
  } tanh_form;
  torch::manual_seed(12);
  const int64_t rows = 20001;
  const auto leaf = [](const torch::Tensor& t) { return t.clone().requires_grad_(true); };
  const std::vector<torch::Tensor> start{
      torch::randn({1, rows, 256}, bf16_cuda()),     torch::randn({1, rows, 256}, bf16_cuda()),
      torch::randn({1024, 256}, bf16_cuda()) * 0.1,  torch::randn({1024}, bf16_cuda()) * 0.5,
      torch::randn({256, 1024}, bf16_cuda()) * 0.05, torch::randn({256}, bf16_cuda())};
  const auto up = torch::randn({1, rows, 256}, bf16_cuda()).to(f32);
  const char* names[] = {"x", "r", "W1", "b1", "W2", "b2"};
  const auto grads_of = [&](const std::vector<torch::Tensor>& p) {
    std::vector<torch::Tensor> g;
    for (const auto& t : p) g.push_back(t.grad().to(f32));
    return g;
  };
  // The fp32 ops on the same (bf16) values.
  std::vector<torch::Tensor> ref;
  for (const auto& t : start) ref.push_back(leaf(t.to(f32)));
  const auto yr =
      torch::linear(torch::gelu(torch::linear(ref[0], ref[2], ref[3]), "tanh"), ref[4], ref[5]) +
      ref[1];
  (yr * up).sum().backward();
  const auto gr = grads_of(ref);
  // The bf16 ops apart.
  std::vector<torch::Tensor> ops;
  for (const auto& t : start) ops.push_back(leaf(t));
  const auto yo =
      torch::linear(torch::gelu(torch::linear(ops[0], ops[2], ops[3]), "tanh"), ops[4], ops[5]) +
      ops[1];
  (yo.to(f32) * up).sum().backward();
  const auto go = grads_of(ops);
  for (const bool keep : {false, true}) {
    std::vector<torch::Tensor> p;
    for (const auto& t : start) p.push_back(leaf(t));
    const int64_t before = gelu_epilogue_uses();
    const auto y = gelu_mlp(p[0], p[2], p[3], p[4], p[5], p[1], keep);
    (y.to(f32) * up).sum().backward();
    EXPECT_EQ(gelu_epilogue_uses() - before, 2) << keep;
    const double ey = relative_error(y.to(f32), yr), eo = relative_error(yo.to(f32), yr);
    std::printf("gelu_mlp tanh (keep %d): output %.2e against fp32 (ops apart %.2e)\n", keep, ey,
                eo);
    EXPECT_LT(ey, std::max(1.5 * eo, 4e-3)) << keep;
    const auto gp = grads_of(p);
    for (size_t i = 0; i < gp.size(); ++i) {
      const double e = relative_error(gp[i], gr[i]), ea = relative_error(go[i], gr[i]);
      std::printf("gelu_mlp tanh (keep %d): gradient %s %.2e against fp32 (ops apart %.2e)\n", keep,
                  names[i], e, ea);
      EXPECT_LT(e, std::max(1.5 * ea, 4e-3)) << keep << " " << names[i];
    }
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
