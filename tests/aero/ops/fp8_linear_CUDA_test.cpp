// precision: fp8 on the GPU (run by scripts/gpu_check.sh; skipped without
// CUDA or on a GPU without fp8 tensor cores): the fp8 Linear's output and
// gradients against the fp32 product, beside the bf16 path's; the amaxes
// it records and the scales delayed scaling makes of them; an overflowing
// step leaving the scales alone; which products it takes, and which parts
// of a model numerics.fp8_exclude keeps in bf16; and the whole
// Transolver in fp8 against fp32, beside bf16; the cast kernels byte for
// byte against PyTorch's own cast (of ATen's GELU and GELU backward for
// the fused ones), the fused fp8 MLP against its ops apart; the fp8
// product with a residual in its epilogue, and the pair of projections of
// one input, against the ops apart.
#include "aero/model/transolver/transolver.h"
#include "aero/ops/fp8_linear.h"
#include "aero/ops/fused_layer_norm.h"
#include "aero/ops/linear.h"
#include "core/device/device.h"

#include <torch/version.h>
#if defined(SLIPSTREAM_WITH_CUDA) && \
    (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1))
#define SLIPSTREAM_TEST_FP8_KERNELS 1
#include <ATen/cuda/CUDAContext.h>

#include "aero/kernels/fp8_kernels.h"
#include "aero/kernels/layer_norm_kernels.h"
#include "aero/ops/lt_matmul.h"
#endif

#include "support/cuda_skip.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace slipstream::aero {
namespace {

using testing::relative_error;

#define SKIP_WITHOUT_FP8()                                                         \
  SKIP_WITHOUT_CUDA();                                                             \
  if (const auto why = fp8::unsupported(c10::Device(c10::kCUDA, 0)); !why.empty()) \
  GTEST_SKIP() << why

// fp8 on with `recipe` while alive, off after.
struct Fp8On {
  explicit Fp8On(fp8::Recipe recipe = {}) { fp8::configure(true, recipe); }
  ~Fp8On() { fp8::configure(false, {}); }
  Fp8On(const Fp8On&) = delete;
  Fp8On& operator=(const Fp8On&) = delete;
};

// A leaf copy of t that takes gradients.
torch::Tensor leaf(const torch::Tensor& t) { return t.detach().clone().requires_grad_(true); }

// A fresh step of delayed scaling: the tensors' gradients dropped and the
// scales remade from the amaxes so far.
void next_step(std::initializer_list<torch::Tensor*> tensors) {
  for (auto* t : tensors) t->mutable_grad() = torch::Tensor();
  fp8::update_scales();
}

struct Grads {
  torch::Tensor y, gx, gw, gb;
  fp8::State state;  // of the product's own weight (fp8 runs)
};

// y = linear(x, w, b) and the gradients of sum(y * up), all in fp32.
Grads run_linear(const torch::Tensor& x_in, const torch::Tensor& w_in, const torch::Tensor& b_in,
                 const torch::Tensor& up, bool fp32) {
  auto x = leaf(x_in);
  auto w = leaf(w_in);
  auto b = leaf(b_in);
  torch::Tensor y;
  if (fp32) {
    y = torch::matmul(x.to(torch::kFloat), w.t()) + b;
  } else {
    AutocastGuard autocast(x.device(), true);
    y = linear(x, w, b);
  }
  (y.to(torch::kFloat) * up).sum().backward();
  return {y.detach().to(torch::kFloat), x.grad().to(torch::kFloat), w.grad(), b.grad(),
          fp8::state_of(w)};
}

// The GeoTransolver MLP's shapes (448 -> 1792 -> 448) and the Transolver's
// (256 -> 256), at 200k rows: fp8's errors against fp32 are a few times
// bf16's (that it ran in fp8 at all) and within the stated bounds: 6 %
// for the output, 15 % for the gradients of x and W (e5m2 keeps two
// mantissa bits), 1 % for the bias's (summed from the bf16 gradient).
TEST(Fp8LinearCudaTest, OutputAndGradientsNearFp32_CUDA) {
  SKIP_WITHOUT_FP8();
  for (const auto& [in, out] :
       std::vector<std::pair<int64_t, int64_t>>{{256, 256}, {448, 1792}, {1792, 448}}) {
    torch::manual_seed(in + out);
    const int64_t rows = 200000;
    const auto cuda = torch::TensorOptions().device(torch::kCUDA);
    const auto x = torch::randn({1, rows, in}, cuda).to(torch::kBFloat16);
    const auto w = torch::randn({out, in}, cuda) / std::sqrt(double(in));
    const auto b = torch::randn({out}, cuda) * 0.1;
    const auto up =
        torch::randn({1, rows, out}, cuda).to(torch::kBFloat16).to(torch::kFloat) * 1e-4;
    const Grads ref = run_linear(x, w, b, up, true);
    const Grads bf16 = run_linear(x, w, b, up, false);
    Grads f8;
    {
      Fp8On on;
      ASSERT_TRUE(fp8::applies(x, w));
      f8 = run_linear(x, w, b, up, false);
      const auto& state = f8.state;
      ASSERT_TRUE(state.amax.defined());
      // What was recorded: max |x|, max |W|, max |dy| exactly (the gradient
      // reaches the Linear in bf16).
      EXPECT_EQ(state.amax[0].item<float>(), x.abs().max().to(torch::kFloat).item<float>());
      EXPECT_EQ(state.amax[1].item<float>(), w.abs().max().item<float>());
      EXPECT_EQ(state.amax[2].item<float>(),
                up.to(torch::kBFloat16).abs().max().to(torch::kFloat).item<float>());
    }
    const std::map<std::string, std::pair<double, double>> err = {
        {"y", {relative_error(bf16.y, ref.y), relative_error(f8.y, ref.y)}},
        {"gx", {relative_error(bf16.gx, ref.gx), relative_error(f8.gx, ref.gx)}},
        {"gw", {relative_error(bf16.gw, ref.gw), relative_error(f8.gw, ref.gw)}},
        {"gb", {relative_error(bf16.gb, ref.gb), relative_error(f8.gb, ref.gb)}}};
    for (const auto& [name, e] : err) {
      std::printf("%4lld -> %4lld %-2s: bf16 %.2e  fp8 %.2e\n", static_cast<long long>(in),
                  static_cast<long long>(out), name.c_str(), e.first, e.second);
    }
    EXPECT_LE(err.at("y").second, 0.06);
    EXPECT_LE(err.at("gx").second, 0.15);
    EXPECT_LE(err.at("gw").second, 0.15);
    EXPECT_LE(err.at("gb").second, 0.01);
    EXPECT_GT(err.at("y").second, 2 * err.at("y").first);  // it did run in fp8
    EXPECT_GT(err.at("gw").second, 2 * err.at("gw").first);
  }
}

// Delayed scaling: each update_scales() enters the amaxes since the last
// into a history of `history` steps and makes scale = limit / max(history)
// / 2^margin; the first cast's scale comes from its own amax; a step whose
// amax is not finite is entered as 0 and leaves the scales as they were.
TEST(Fp8LinearCudaTest, ScalesFollowTheAmaxHistory_CUDA) {
  SKIP_WITHOUT_FP8();
  const fp8::Recipe recipe{3, 1, {}};
  Fp8On on(recipe);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(3);
  const auto w = torch::randn({64, 32}, cuda).requires_grad_(true);
  const auto b = torch::zeros({64}, cuda).requires_grad_(true);
  const auto base = torch::rand({256, 32}, cuda) * 2 - 1;
  const std::vector<double> factors = {1.0, 8.0, 0.5, 0.25, 0.125, 2.0};
  std::vector<float> amaxes;
  for (size_t step = 0; step < factors.size(); ++step) {
    fp8::update_scales();
    const auto x = (base * factors[step]).to(torch::kBFloat16).requires_grad_(true);
    const float amax = x.abs().max().to(torch::kFloat).item<float>();
    const auto state = fp8::state_of(w);
    if (step == 0) {
      EXPECT_FALSE(state.amax.defined());  // no fp8 product has seen w yet
    } else {
      float m = 0;
      for (size_t k = amaxes.size() > 3 ? amaxes.size() - 3 : 0; k < amaxes.size(); ++k) {
        m = std::max(m, amaxes[k]);
      }
      EXPECT_FLOAT_EQ(state.scale[0].item<float>(), 448.f / m / 2.f) << "step " << step;
      EXPECT_EQ(state.amax[0].item<float>(), 0.f) << "reset by the update";
    }
    auto y = fp8::linear(x, w, b);
    y.sum().backward();
    if (step == 0) {
      // The first scale, from the first cast's own amax.
      EXPECT_FLOAT_EQ(fp8::state_of(w).scale[0].item<float>(), 448.f / amax / 2.f);
    }
    amaxes.push_back(amax);
  }
  // An overflowing step: its amax is +inf, entered as 0; the scales stay.
  fp8::update_scales();
  auto bad = (base * 1.0).to(torch::kBFloat16);
  bad[0][0] = std::numeric_limits<float>::infinity();
  fp8::linear(bad, w, b).sum().backward();
  EXPECT_TRUE(std::isinf(fp8::state_of(w).amax[0].item<float>()));
  fp8::update_scales();
  const auto after = fp8::state_of(w);
  // Input slot: the history's other two entries still give the same scale
  // only if they held its maximum; compare against them directly.
  const auto hist = after.history[0];
  EXPECT_EQ(hist.min().item<float>(), 0.f) << "the inf entered as 0";
  EXPECT_FLOAT_EQ(after.scale[0].item<float>(), 448.f / hist.max().item<float>() / 2.f);
  EXPECT_TRUE(torch::isfinite(after.scale).all().item<bool>());
}

// What takes the fp8 path: fp8 on, one GPU, widths multiples of 16 (rows
// padded: a row count that is not one gives the same rows as the product
// padded by hand); linear.h's Linears route there then; with fp8 off
// nothing does.
TEST(Fp8LinearCudaTest, TakesProductsOfWidthsAndRowsMultiplesOf16_CUDA) {
  SKIP_WITHOUT_FP8();
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  const auto x = torch::randn({4, 64, 32}, cuda).to(torch::kBFloat16);
  const auto w = torch::randn({48, 32}, cuda), b = torch::zeros({48}, cuda);
  EXPECT_FALSE(fp8::applies(x, w)) << "fp8 is off";
  Fp8On on;
  EXPECT_TRUE(fp8::applies(x, w));
  EXPECT_FALSE(fp8::applies(x, torch::randn({40, 32}, cuda)));  // out 40
  // 4 x 61 = 244 rows, padded to 256 in the fp8 copies: the same values as
  // the first 244 rows of a product of 256 rows whose last 12 are zero, and
  // the same weight gradient.
  {
    const auto x61 = x.narrow(1, 0, 61).contiguous().requires_grad_(true);
    const auto up = torch::randn({4, 61, 48}, cuda).to(torch::kBFloat16);
    const auto w61 = w.clone().requires_grad_(true);
    ASSERT_TRUE(fp8::applies(x61, w61));
    const auto y61 = fp8::linear(x61, w61, b);
    (y61 * up).sum().backward();
    const auto x64 = torch::zeros({4, 64, 32}, cuda).to(torch::kBFloat16);
    x64.narrow(1, 0, 61).copy_(x61.detach());
    const auto up64 = torch::zeros({4, 64, 48}, cuda).to(torch::kBFloat16);
    up64.narrow(1, 0, 61).copy_(up);
    const auto x64g = x64.clone().requires_grad_(true);
    const auto w64 = w.clone().requires_grad_(true);
    Fp8On again;  // the same first scales from the same amaxes
    const auto y64 = fp8::linear(x64g, w64, b);
    (y64 * up64).sum().backward();
    // Rows sit elsewhere in the two products: equal up to the GEMMs' order
    // (Hopper's fp8 products accumulate in reduced precision within each
    // block of k, which the two orders fill differently).
    EXPECT_TRUE(
        torch::allclose(y61.to(torch::kFloat), y64.narrow(1, 0, 61).to(torch::kFloat), 1e-2, 1e-2));
    EXPECT_TRUE(torch::allclose(x61.grad().to(torch::kFloat),
                                x64g.grad().narrow(1, 0, 61).to(torch::kFloat), 1e-2, 1e-2));
    EXPECT_TRUE(torch::allclose(w61.grad(), w64.grad(), 1e-2, 1e-2));
  }
  Fp8On fresh;
  EXPECT_FALSE(fp8::applies(x.cpu(), w.cpu()));  // not a GPU
  const auto y = linear(x, w, b);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{4, 64, 48}));
  EXPECT_TRUE(fp8::state_of(w).amax.defined()) << "linear.h routed the product to fp8";
  const auto no_bias = linear(x, w, torch::Tensor());
  EXPECT_EQ(no_bias.scalar_type(), torch::kBFloat16);
}

// numerics.fp8_exclude: a Linear inside a Scope of an excluded part runs
// the bf16 product (no fp8 state, the bf16 result exactly), one of another
// part runs in fp8; the Transolver's embedding MLP and attention inputs
// say which part they are.
TEST(Fp8LinearCudaTest, ExcludedPartsStayBf16_CUDA) {
  SKIP_WITHOUT_FP8();
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  const auto x = torch::randn({2, 64, 32}, cuda).to(torch::kBFloat16);
  const auto w = torch::randn({48, 32}, cuda), b = torch::zeros({48}, cuda);
  AutocastGuard autocast(torch::kCUDA, true);  // the bf16 path casts w as under precision: bf16
  const auto bf16 = linear(x, w, b);
  Fp8On on({16, 0, {fp8::Part::kEmbedding}});
  {
    const fp8::Scope embedding(fp8::Part::kEmbedding);
    EXPECT_FALSE(fp8::applies(x, w));
    EXPECT_TRUE(torch::equal(linear(x, w, b), bf16));
    {
      const fp8::Scope inner(fp8::Part::kAttentionInputs);  // the innermost counts
      EXPECT_TRUE(fp8::applies(x, w));
    }
    EXPECT_FALSE(fp8::applies(x, w));
  }
  EXPECT_FALSE(fp8::state_of(w).amax.defined());
  EXPECT_TRUE(fp8::applies(x, w));
  EXPECT_FALSE(torch::equal(linear(x, w, b), bf16));
  EXPECT_TRUE(fp8::state_of(w).amax.defined());

  TransolverOptions o;
  o.n_layers = 1;
  o.n_hidden = 64;
  o.n_head = 4;
  o.slice_num = 32;
  o.functional_dim = 3;
  o.embedding_dim = 13;  // 16 inputs: the embedding's first Linear could run in fp8
  o.out_dim = 16;
  for (const auto& excluded : {fp8::Part::kEmbedding, fp8::Part::kAttentionInputs}) {
    Fp8On only({16, 0, {excluded}});
    Transolver m(o);
    m->to(torch::kCUDA);
    (void)m->forward(torch::randn({1, 256, 13}, cuda), torch::randn({1, 256, 3}, cuda));
    const auto& pre = *m->preprocess->layers[0]->as<torch::nn::Linear>();
    const auto& attn = *m->blocks[0]->as<TransolverBlock>()->Attn;
    EXPECT_EQ(fp8::state_of(pre.weight).amax.defined(), excluded != fp8::Part::kEmbedding);
    EXPECT_EQ(fp8::state_of(attn.in_project_x->weight).amax.defined(),
              excluded != fp8::Part::kAttentionInputs);
    EXPECT_TRUE(fp8::state_of(attn.out_linear->weight).amax.defined());
  }
}

struct ModelResult {
  torch::Tensor out;
  std::map<std::string, torch::Tensor> grads;
};

ModelResult model_step(Transolver& m, const torch::Tensor& emb, const torch::Tensor& fx,
                       const torch::Tensor& upstream, bool autocast_on) {
  m->zero_grad();
  ModelResult r;
  {
    AutocastGuard autocast(emb.device(), autocast_on);
    r.out = m->forward(emb, fx).to(torch::kFloat);
  }
  (r.out * upstream).sum().backward();
  for (const auto& p : m->named_parameters()) {
    if (p.value().grad().defined()) r.grads[p.key()] = p.value().grad().clone();
  }
  return r;
}

// The Transolver of the volume widths (3 layers) at 200k points, fp32,
// bf16 and fp8 (two warm-up steps so that its scales come from a history):
// the stated bounds for fp8 against fp32 are 10 % for the output and, for
// every parameter's gradient, 25 % or 1.5 times bf16's own error, whichever
// is larger (some gradients are that far from fp32 in bf16 already: the
// slice projection's weight 0.25 on an H100, fp8 0.33).
TEST(Fp8LinearCudaTest, TransolverInFp8NearFp32_CUDA) {
  SKIP_WITHOUT_FP8();
  torch::manual_seed(11);
  TransolverOptions o;
  o.n_layers = 3;
  Transolver m(o);
  m->to(torch::kCUDA);
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  const int64_t n = 200000;
  const auto emb = torch::randn({1, n, 7}, opts), fx = torch::randn({1, n, 3}, opts);
  const auto upstream = torch::randn({1, n, o.out_dim}, opts) / n;
  const auto ref = model_step(m, emb, fx, upstream, false);
  const auto bf16 = model_step(m, emb, fx, upstream, true);
  ModelResult f8;
  {
    Fp8On on;
    for (int i = 0; i < 3; ++i) {
      fp8::update_scales();
      f8 = model_step(m, emb, fx, upstream, true);
    }
  }
  const double out_b = relative_error(bf16.out, ref.out), out_f = relative_error(f8.out, ref.out);
  std::printf("output: bf16 %.2e fp8 %.2e\n", out_b, out_f);
  EXPECT_LE(out_f, 0.10);
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, want] : ref.grads) {
    ASSERT_TRUE(f8.grads.count(name)) << name;
    const double b = relative_error(bf16.grads.at(name), want),
                 f = relative_error(f8.grads.at(name), want);
    EXPECT_LE(f, std::max(0.25, 1.5 * b)) << name << ": bf16 " << b << ", fp8 " << f;
    if (f > worst) {
      worst = f;
      worst_name = name;
    }
  }
  std::printf("largest fp8 gradient error: %s %.2e\n", worst_name.c_str(), worst);
}

// The cast kernel against PyTorch's own cast of (x * scale) clamped to the
// format's range, byte for byte: row-major and transposed copies, the
// padding rows zero, the amax. Shapes take both paths: the vectorised one
// (columns a multiple of 8, aligned pointers; tiles cut by the edges) and
// the plain one (a misaligned input, 20 columns).
TEST(Fp8LinearCudaTest, TheCastMatchesTorchsCastByteForByte_CUDA) {
  SKIP_WITHOUT_FP8();
#ifndef SLIPSTREAM_TEST_FP8_KERNELS
  GTEST_SKIP() << "built without the fp8 kernels";
#else
  namespace fk = fp8_kernels;
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  struct Case {
    int64_t rows, cols;
    bool misaligned;
  };
  torch::manual_seed(11);
  for (const auto format : {fk::Format::kE4M3, fk::Format::kE5M2}) {
    for (const auto dtype : {torch::kBFloat16, torch::kFloat}) {
      for (const Case c : {Case{1000, 48, false}, Case{333, 256, false}, Case{64, 24, false},
                           Case{4099, 1024, false}, Case{77, 32, true}, Case{50, 20, false}}) {
        const int64_t rows_out = (c.rows + 15) / 16 * 16;
        const auto label = "format " + std::to_string(static_cast<int>(format)) + " dtype " +
                           std::string(c10::toString(dtype)) + " " + std::to_string(c.rows) + "x" +
                           std::to_string(c.cols) + (c.misaligned ? " misaligned" : "");
        // Spread over many binades, a few beyond the range after scaling.
        auto x = (torch::randn({c.rows, c.cols}, cuda) *
                  torch::exp(torch::randn({c.rows, c.cols}, cuda) * 3))
                     .to(dtype);
        if (c.misaligned) {
          auto buffer = torch::empty({c.rows * c.cols + 1}, cuda.dtype(dtype));
          buffer.narrow(0, 1, c.rows * c.cols).copy_(x.flatten());
          x = buffer.narrow(0, 1, c.rows * c.cols).view({c.rows, c.cols});
        }
        const float amax_ref = x.abs().max().to(torch::kFloat).item<float>();
        const float limit = fk::max_finite(format);
        const auto scale =
            torch::full({1}, 0.5f * limit / amax_ref * 64.f, cuda.dtype(torch::kFloat));
        const auto fp8_dtype =
            format == fk::Format::kE4M3 ? torch::kFloat8_e4m3fn : torch::kFloat8_e5m2;
        auto ref = torch::zeros({rows_out, c.cols}, cuda.dtype(fp8_dtype));
        ref.narrow(0, 0, c.rows)
            .copy_((x.to(torch::kFloat) * scale).clamp(-limit, limit).to(fp8_dtype));
        auto q = torch::full({rows_out, c.cols}, 7, cuda.dtype(torch::kUInt8));
        auto q_t = torch::full({c.cols, rows_out}, 7, cuda.dtype(torch::kUInt8));
        auto amax = torch::zeros({1}, cuda.dtype(torch::kFloat));
        fk::quantize(x.data_ptr(), dtype == torch::kFloat, c.rows, rows_out, c.cols,
                     scale.data_ptr<float>(), format, q.data_ptr<uint8_t>(),
                     q_t.data_ptr<uint8_t>(), amax.data_ptr<float>(),
                     at::cuda::getCurrentCUDAStream().stream());
        const auto ref_bytes = ref.view(torch::kUInt8);
        EXPECT_TRUE(torch::equal(q, ref_bytes))
            << label << ": " << q.ne(ref_bytes).sum().item<int64_t>() << " bytes differ";
        EXPECT_TRUE(torch::equal(q_t, ref_bytes.t().contiguous())) << label << " (transposed)";
        EXPECT_EQ(amax.item<float>(), amax_ref) << label;
      }
    }
  }
#endif
}

// The casts of gelu(h) and of GELU's backward against ATen's gelu and
// gelu_backward, then PyTorch's cast, byte for byte (both copies, the
// padding rows zero, the amax), and the backward's column sums against
// PyTorch's sum of ATen's gradient; the backward's pass also casting
// gelu(h) itself (GeluForwardCopy) as the forward's does, its transposed
// copy and amax byte for byte. h has values off the kernels' GELU
// table (zeros, tiny, beyond 32); the last shape has more row tiles than a
// block strip's share of the grid.
TEST(Fp8LinearCudaTest, GeluCastsMatchAtensGeluThenTheCastByteForByte_CUDA) {
  SKIP_WITHOUT_FP8();
#ifndef SLIPSTREAM_TEST_FP8_KERNELS
  GTEST_SKIP() << "built without the fp8 kernels";
#else
  namespace fk = fp8_kernels;
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  const auto stream = at::cuda::getCurrentCUDAStream().stream();
  torch::manual_seed(12);
  for (const auto [rows, cols] :
       {std::pair<int64_t, int64_t>{1000, 48}, {333, 256}, {64, 24}, {4099, 1024}, {70001, 1792}}) {
    const int64_t rows_out = (rows + 15) / 16 * 16;
    auto h = torch::randn({rows, cols}, cuda) * 2;
    h.view({-1}).narrow(0, 0, 7).copy_(
        torch::tensor({0.f, 1e-6f, -3e-7f, 40.f, -40.f, 1e4f, -6.f}, cuda));
    h = h.to(torch::kBFloat16);
    const auto g = (torch::randn({rows, cols}, cuda) * 1e-3).to(torch::kBFloat16);
    for (const bool backward : {false, true}) {
      const auto v = backward ? at::gelu_backward(g, h) : at::gelu(h);
      for (const auto format : {fk::Format::kE4M3, fk::Format::kE5M2}) {
        const auto label = std::string(backward ? "backward " : "forward ") + "format " +
                           std::to_string(static_cast<int>(format)) + " " + std::to_string(rows) +
                           "x" + std::to_string(cols);
        ASSERT_TRUE(
            fk::gelu_supported(rows_out, cols, h.data_ptr(), g.data_ptr(), nullptr, nullptr))
            << label;
        const float amax_ref = v.abs().max().to(torch::kFloat).item<float>();
        const float limit = fk::max_finite(format);
        const auto scale =
            torch::full({1}, 0.5f * limit / amax_ref * 16.f, cuda.dtype(torch::kFloat));
        const auto fp8_dtype =
            format == fk::Format::kE4M3 ? torch::kFloat8_e4m3fn : torch::kFloat8_e5m2;
        auto ref = torch::zeros({rows_out, cols}, cuda.dtype(fp8_dtype));
        ref.narrow(0, 0, rows)
            .copy_((v.to(torch::kFloat) * scale).clamp(-limit, limit).to(fp8_dtype));
        auto q = torch::full({rows_out, cols}, 7, cuda.dtype(torch::kUInt8));
        auto q_t = torch::full({cols, rows_out}, 7, cuda.dtype(torch::kUInt8));
        auto amax = torch::zeros({1}, cuda.dtype(torch::kFloat));
        auto colsum = torch::full({cols}, 7.f, cuda.dtype(torch::kFloat));
        auto partial =
            torch::empty({fk::gelu_partial_rows(rows_out, cols, format), cols}, colsum.options());
        // The backward also casts gelu(h) itself (its e4m3 transposed copy).
        const auto fwd = at::gelu(h).to(torch::kFloat);
        const float fwd_amax_ref = fwd.abs().max().item<float>();
        const auto fwd_scale =
            torch::full({1}, 0.5f * 448.f / fwd_amax_ref * 4.f, cuda.dtype(torch::kFloat));
        auto fwd_ref = torch::zeros({rows_out, cols}, cuda.dtype(torch::kFloat8_e4m3fn));
        fwd_ref.narrow(0, 0, rows)
            .copy_((fwd * fwd_scale).clamp(-448.f, 448.f).to(torch::kFloat8_e4m3fn));
        auto fwd_t = torch::full({cols, rows_out}, 7, cuda.dtype(torch::kUInt8));
        auto fwd_amax = torch::zeros({1}, cuda.dtype(torch::kFloat));
        const fk::GeluForwardCopy also{fwd_scale.data_ptr<float>(), fwd_t.data_ptr<uint8_t>(),
                                       fwd_amax.data_ptr<float>()};
        fk::quantize_gelu(
            h.data_ptr(), backward ? g.data_ptr() : nullptr, rows, rows_out, cols,
            scale.data_ptr<float>(), format, q.data_ptr<uint8_t>(), q_t.data_ptr<uint8_t>(),
            amax.data_ptr<float>(), backward ? partial.data_ptr<float>() : nullptr,
            backward ? colsum.data_ptr<float>() : nullptr, stream, backward ? &also : nullptr);
        if (backward) {
          EXPECT_TRUE(torch::equal(fwd_t, fwd_ref.view(torch::kUInt8).t().contiguous()))
              << label << " (gelu(h)'s copy from the backward's pass)";
          EXPECT_EQ(fwd_amax.item<float>(), fwd_amax_ref) << label << " (gelu(h)'s amax)";
        }
        const auto ref_bytes = ref.view(torch::kUInt8);
        EXPECT_TRUE(torch::equal(q, ref_bytes))
            << label << ": " << q.ne(ref_bytes).sum().item<int64_t>() << " bytes differ";
        EXPECT_TRUE(torch::equal(q_t, ref_bytes.t().contiguous())) << label << " (transposed)";
        EXPECT_EQ(amax.item<float>(), amax_ref) << label;
        if (backward) {
          const auto vf = v.to(torch::kFloat);
          const auto ref_sum = vf.sum(0);
          const float tol = 1e-5f * vf.abs().sum(0).max().item<float>();
          EXPECT_LE((colsum - ref_sum).abs().max().item<float>(), tol) << label << " (sums)";
        }
      }
    }
  }
  // The kernel's preconditions are checked, not assumed.
  const auto odd = torch::zeros({32, 20}, cuda.dtype(torch::kBFloat16));
  auto amax = torch::zeros({1}, cuda.dtype(torch::kFloat));
  EXPECT_FALSE(fk::gelu_supported(32, 20, odd.data_ptr(), nullptr, nullptr, nullptr));
  // gelu(h)'s copy rides on GELU's backward alone.
  const auto even = torch::zeros({32, 32}, cuda.dtype(torch::kBFloat16));
  auto bytes = torch::zeros({32, 32}, cuda.dtype(torch::kUInt8));
  const fk::GeluForwardCopy also{amax.data_ptr<float>(), bytes.data_ptr<uint8_t>(),
                                 amax.data_ptr<float>()};
  EXPECT_FALSE(fk::gelu_supported(32, 32, even.data_ptr(), nullptr, bytes.data_ptr<uint8_t>(),
                                  nullptr, &also));
  EXPECT_THROW(fk::quantize_gelu(odd.data_ptr(), nullptr, 32, 32, 20, amax.data_ptr<float>(),
                                 fk::Format::kE4M3, nullptr, nullptr, amax.data_ptr<float>(),
                                 nullptr, nullptr, stream),
               std::invalid_argument);
#endif
}

struct MlpRun {
  torch::Tensor y, gx, gw1, gb1, gw2, gb2;
  fp8::State s1, s2;
};

// An MLP's input x (bf16), weights and biases (fp32) and the upstream
// gradient of a sum(y * up) loss, from `seed`.
struct MlpInputs {
  torch::Tensor x, w1, b1, w2, b2, up;
};

MlpInputs mlp_inputs(uint64_t seed, int64_t rows, int64_t in, int64_t hidden) {
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(seed);
  MlpInputs m;
  m.x = torch::randn({rows, in}, cuda).to(torch::kBFloat16);
  m.w1 = torch::randn({hidden, in}, cuda) / std::sqrt(double(in));
  m.b1 = torch::randn({hidden}, cuda) * 0.1;
  m.w2 = torch::randn({in, hidden}, cuda) / std::sqrt(double(hidden));
  m.b2 = torch::randn({in}, cuda) * 0.1;
  m.up = torch::randn({rows, in}, cuda);
  return m;
}

// Two steps of linear(gelu(linear(x, w1, b1)), w2, b2) in fp8, fused (one
// function, keeping gelu(h)'s copy or not) or as the three ops apart, from
// a fresh scaling state: the second step's output and the gradients of
// sum(y * up), and the weights' scaling states after it.
MlpRun run_fp8_mlp(const MlpInputs& in, bool fused, bool keep_gelu = true) {
  const Fp8On on;
  auto x = leaf(in.x);
  auto w1 = leaf(in.w1);
  auto b1 = leaf(in.b1);
  auto w2 = leaf(in.w2);
  auto b2 = leaf(in.b2);
  torch::Tensor y;
  for (int step = 0; step < 2; ++step) {
    next_step({&x, &w1, &b1, &w2, &b2});
    y = fused ? fp8::gelu_mlp(x, w1, b1, w2, b2, {}, keep_gelu)
              : fp8::linear(torch::gelu(fp8::linear(x, w1, b1)), w2, b2);
    (y.to(torch::kFloat) * in.up).sum().backward();
  }
  return {y.detach(), x.grad(),  w1.grad(),         b1.grad(),
          w2.grad(),  b2.grad(), fp8::state_of(w1), fp8::state_of(w2)};
}

// Both runs' weights' scaling states (amax, history, scale) bitwise equal.
void expect_same_states(const MlpRun& a, const MlpRun& b) {
  for (const auto& [p, q] : {std::pair{&a.s1, &b.s1}, std::pair{&a.s2, &b.s2}}) {
    EXPECT_TRUE(torch::equal(p->amax, q->amax));
    EXPECT_TRUE(torch::equal(p->history, q->history));
    EXPECT_TRUE(torch::equal(p->scale, q->scale));
  }
}

// The fused fp8 MLP against its three ops apart (the GeoTransolver's
// widths, rows not a multiple of 16, two steps so that the second runs on
// delayed scales): the same output, x's and the weights' gradients, b2's
// and the scaling states bitwise; b1's gradient to fp32 summation order.
TEST(Fp8LinearCudaTest, TheFusedMlpMatchesItsOpsApart_CUDA) {
  SKIP_WITHOUT_FP8();
  const auto m = mlp_inputs(13, 20005, 448, 1792);
  {
    const Fp8On on;
    ASSERT_TRUE(fp8::gelu_mlp_applies(m.x, m.w1, m.w2));
  }
  const auto fused = run_fp8_mlp(m, true);
  const auto apart = run_fp8_mlp(m, false);
  EXPECT_TRUE(torch::equal(fused.y, apart.y));
  EXPECT_TRUE(torch::equal(fused.gx, apart.gx));
  EXPECT_TRUE(torch::equal(fused.gw1, apart.gw1));
  EXPECT_TRUE(torch::equal(fused.gw2, apart.gw2));
  EXPECT_TRUE(torch::equal(fused.gb2, apart.gb2));
  EXPECT_LE(relative_error(fused.gb1, apart.gb1), 1e-5);
  expect_same_states(fused, apart);
  // No gradient asked for: nothing kept, the same output.
  {
    const Fp8On on;
    const torch::NoGradGuard no_grad;
    const auto y = fp8::gelu_mlp(m.x, m.w1, m.b1, m.w2, m.b2);
    const auto y_apart = fp8::linear(torch::gelu(fp8::linear(m.x, m.w1, m.b1)), m.w2, m.b2);
    EXPECT_TRUE(torch::equal(y, y_apart));
  }
}

// The fused fp8 MLP that does not keep gelu(h)'s e4m3 copy (an Mlp's
// recompute_gelu) casts it again in the backward: the same output,
// gradients and scaling states as the one keeping it, bitwise, with that
// copy's memory (hidden x rows bytes) not held between the forward and
// the backward.
TEST(Fp8LinearCudaTest, TheFusedMlpRecomputingGeluMatchesTheOneKeepingIt_CUDA) {
  SKIP_WITHOUT_FP8();
  const int64_t rows = 20005, hidden = 1024;
  const auto m = mlp_inputs(29, rows, 256, hidden);
  const auto keep = run_fp8_mlp(m, true, true);
  const auto remake = run_fp8_mlp(m, true, false);
  EXPECT_TRUE(torch::equal(keep.y, remake.y));
  EXPECT_TRUE(torch::equal(keep.gx, remake.gx));
  EXPECT_TRUE(torch::equal(keep.gw1, remake.gw1));
  EXPECT_TRUE(torch::equal(keep.gb1, remake.gb1));
  EXPECT_TRUE(torch::equal(keep.gw2, remake.gw2));
  EXPECT_TRUE(torch::equal(keep.gb2, remake.gb2));
  expect_same_states(keep, remake);
  // What one forward holds for its backward, each way (after a first step,
  // so that no first-scale work or GEMM tuning runs inside the measurement;
  // from an emptied allocator cache). The allocator counts a cached block
  // whole where it is at most 1 MiB larger than the request, so each way
  // may count up to 1 MiB more than it holds.
  const auto held = [&](bool keep_gelu) {
    const Fp8On on;
    auto xl = leaf(m.x), w1l = leaf(m.w1), b1l = leaf(m.b1), w2l = leaf(m.w2), b2l = leaf(m.b2);
    (fp8::gelu_mlp(xl, w1l, b1l, w2l, b2l, {}, keep_gelu).to(torch::kFloat) * m.up)
        .sum()
        .backward();
    torch::cuda::synchronize();
    empty_device_cache(torch::Device(torch::kCUDA, 0));
    const double before = memory_allocated_gib(torch::Device(torch::kCUDA, 0));
    const auto y = fp8::gelu_mlp(xl, w1l, b1l, w2l, b2l, {}, keep_gelu);
    torch::cuda::synchronize();
    return (memory_allocated_gib(torch::Device(torch::kCUDA, 0)) - before) * double(1 << 30);
  };
  const double copy = double(hidden) * double((rows + 15) / 16 * 16);
  const double kept = held(true), remade = held(false);
  EXPECT_GE(kept - remade, copy - double(1 << 20))
      << kept << " bytes held keeping gelu(h)'s copy, " << remade << " without";
  EXPECT_LT(kept - remade, 1.5 * copy);
}

// Whether each element of got is within a bf16 rounding or two of want,
// the sum of terms a and b: |got - want| <= 2^-7 (|a| + |b|). A term
// dropped or added twice is far outside it.
bool within_two_roundings(const torch::Tensor& got, const torch::Tensor& want,
                          const torch::Tensor& a, const torch::Tensor& b) {
  const auto f = [](const torch::Tensor& t) { return t.to(torch::kFloat); };
  const auto bound = (f(a).abs() + f(b).abs()) * (1.0 / 128) + 1e-30;
  return ((f(got) - f(want)).abs() <= bound).all().item<bool>();
}

#ifdef SLIPSTREAM_TEST_FP8_KERNELS
// lt_matmul::scaled_mm, which adds a residual in the fp8 GEMM's epilogue,
// against _scaled_mm plus the add, at the Transolver's shapes: taken for
// e4m3 and e5m2 inputs, bf16 (with a bias) and fp32 outputs, each sum
// rounded once; declined for two e5m2 operands or bf16 ones.
TEST(Fp8LinearCudaTest, ScaledMmAddsCInItsEpilogue_CUDA) {
  SKIP_WITHOUT_FP8();
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(17);
  const int64_t rows = 20000, in = 256, out = 1024;
  // Scales one to a 16-byte row, as the fp8 registry keeps them.
  const auto scales = torch::tensor({0.5f, 0.f, 0.f, 0.f, 0.25f, 0.f, 0.f, 0.f}, cuda);
  const auto sa = scales[0], sb = scales[4];
  const auto w = (torch::randn({out, in}, cuda) * 8).to(torch::kFloat8_e4m3fn);
  for (const auto a_type : {torch::kFloat8_e4m3fn, torch::kFloat8_e5m2}) {
    const auto a = (torch::randn({rows, in}, cuda) * 8).to(a_type);
    for (const auto out_type : {torch::kBFloat16, torch::kFloat}) {
      const auto bias = out_type == torch::kBFloat16
                            ? torch::randn({out}, cuda).to(torch::kBFloat16)
                            : torch::Tensor();
      const auto c = (torch::randn({rows, out}, cuda) * 64).to(out_type);
      const auto p = at::_scaled_mm(
          a, w.t(), sa, sb,
          bias.defined() ? std::optional<at::Tensor>(bias) : std::optional<at::Tensor>(),
          std::nullopt, out_type, false);
      at::Tensor y;
      ASSERT_TRUE(lt_matmul::scaled_mm(a, w.t(), sa, sb, bias, c, y, out_type, false))
          << a_type << " " << out_type;
      ASSERT_EQ(y.sizes(), c.sizes());
      ASSERT_EQ(y.scalar_type(), out_type);
      EXPECT_TRUE(within_two_roundings(y, p.to(torch::kFloat) + c.to(torch::kFloat), p, c))
          << a_type << " " << out_type;
      if (out_type == torch::kFloat) {
        EXPECT_LE(relative_error(y, p + c), 1e-5);
      }
    }
  }
  at::Tensor y;
  const auto e5 = torch::randn({rows, in}, cuda).to(torch::kFloat8_e5m2);
  EXPECT_FALSE(lt_matmul::scaled_mm(e5, w.to(torch::kFloat8_e5m2).t(), sa, sb, {}, {}, y,
                                    torch::kBFloat16, false));
  const auto bf = torch::randn({rows, in}, cuda).to(torch::kBFloat16);
  EXPECT_FALSE(lt_matmul::scaled_mm(bf, bf.narrow(0, 0, out).t(), sa, sb, {}, {}, y,
                                    torch::kBFloat16, false));
  EXPECT_FALSE(y.defined());
}
#endif

struct ResidualRun {
  torch::Tensor y, p, gx, gw, gb, gr;  // p: the product alone (apart runs)
};

// Two steps of linear(x, w, b) + r in fp8 from a fresh scaling state, the
// residual added by the product (fused) or after it; the second step's
// output and the gradients of sum(y * up). mlp: the fp8 MLP
// gelu_mlp(x, w, b, w2, b2) in place of the Linear.
ResidualRun run_fp8_residual(const torch::Tensor& x_in, const torch::Tensor& w_in,
                             const torch::Tensor& b_in, const torch::Tensor& w2_in,
                             const torch::Tensor& b2_in, const torch::Tensor& r_in,
                             const torch::Tensor& up, bool mlp, bool fused) {
  const Fp8On on;
  auto x = leaf(x_in);
  auto w = leaf(w_in);
  auto b = leaf(b_in);
  auto w2 = leaf(w2_in);
  auto b2 = leaf(b2_in);
  auto r = leaf(r_in);
  torch::Tensor y, p;
  for (int step = 0; step < 2; ++step) {
    next_step({&x, &w, &b, &w2, &b2, &r});
    if (fused) {
      y = mlp ? fp8::gelu_mlp(x, w, b, w2, b2, r) : fp8::linear(x, w, b, r);
    } else {
      p = mlp ? fp8::gelu_mlp(x, w, b, w2, b2) : fp8::linear(x, w, b);
      y = p + r;
    }
    (y.to(torch::kFloat) * up).sum().backward();
  }
  return {y.detach(), p.defined() ? p.detach() : p, x.grad(), w.grad(), b.grad(), r.grad()};
}

// The residual added by the fp8 product (a Linear's, and the fused MLP's
// second) against the add apart, rows not a multiple of 16, two steps: the
// sums within bf16 rounding of the add's (rounded once, not twice), every
// gradient bitwise the same, the residual's the output's.
TEST(Fp8LinearCudaTest, TheResidualAddedByTheProductMatchesTheAdd_CUDA) {
  SKIP_WITHOUT_FP8();
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(19);
  const int64_t rows = 20005, width = 256, hidden = 1024;
  const auto x = torch::randn({1, rows, width}, cuda).to(torch::kBFloat16);
  const auto r = (torch::randn({1, rows, width}, cuda) * 2).to(torch::kBFloat16);
  const auto up = torch::randn({1, rows, width}, cuda);
  for (const bool mlp : {false, true}) {
    const int64_t mid = mlp ? hidden : width;
    const auto w = torch::randn({mid, width}, cuda) / std::sqrt(double(width));
    const auto b = torch::randn({mid}, cuda) * 0.1;
    const auto w2 = torch::randn({width, mid}, cuda) / std::sqrt(double(mid));
    const auto b2 = torch::randn({width}, cuda) * 0.1;
    const auto fused = run_fp8_residual(x, w, b, w2, b2, r, up, mlp, true);
    const auto apart = run_fp8_residual(x, w, b, w2, b2, r, up, mlp, false);
    EXPECT_TRUE(
        within_two_roundings(fused.y, apart.p.to(torch::kFloat) + r.to(torch::kFloat), apart.p, r))
        << (mlp ? "mlp" : "linear");
    EXPECT_TRUE(torch::equal(fused.gx, apart.gx)) << (mlp ? "mlp" : "linear");
    EXPECT_TRUE(torch::equal(fused.gw, apart.gw)) << (mlp ? "mlp" : "linear");
    EXPECT_TRUE(torch::equal(fused.gb, apart.gb)) << (mlp ? "mlp" : "linear");
    EXPECT_TRUE(torch::equal(fused.gr, apart.gr)) << (mlp ? "mlp" : "linear");
    EXPECT_TRUE(torch::equal(fused.gr, up.to(fused.gr.scalar_type())));
  }
}

struct PairRun {
  torch::Tensor y1, y2, gx, gw1, gb1, gw2, gb2;
  fp8::State s1, s2;
};

// Two steps of the two projections of one x in fp8, as linear_pair (one
// function) or two linear()s, from a fresh scaling state: the second
// step's outputs, the gradients of sum(y1 * up1 + y2 * up2) and the
// weights' scaling states.
PairRun run_fp8_pair(const torch::Tensor& x_in, const torch::Tensor& w1_in,
                     const torch::Tensor& b1_in, const torch::Tensor& w2_in,
                     const torch::Tensor& b2_in, const torch::Tensor& up1, const torch::Tensor& up2,
                     bool pair) {
  const Fp8On on;
  auto x = leaf(x_in);
  auto w1 = leaf(w1_in);
  auto b1 = leaf(b1_in);
  auto w2 = leaf(w2_in);
  auto b2 = leaf(b2_in);
  torch::Tensor y1, y2;
  for (int step = 0; step < 2; ++step) {
    next_step({&x, &w1, &b1, &w2, &b2});
    if (pair) {
      std::tie(y1, y2) = fp8::linear_pair(x, w1, b1, w2, b2);
    } else {
      y1 = fp8::linear(x, w1, b1);
      y2 = fp8::linear(x, w2, b2);
    }
    ((y1.to(torch::kFloat) * up1).sum() + (y2.to(torch::kFloat) * up2).sum()).backward();
  }
  return {y1.detach(), y2.detach(), x.grad(),          w1.grad(),        b1.grad(),
          w2.grad(),   b2.grad(),   fp8::state_of(w1), fp8::state_of(w2)};
}

// The pair of projections of one input (the attention's in_project_x and
// in_project_fx) as one fp8 function against two Linears: x cast once,
// both outputs, the weights' and biases' gradients and the scaling states
// bitwise the two apart's (but the second Linear's input slot, which the
// pair leaves unused); x's gradient, its two products summed by the GEMM,
// within bf16 rounding of autograd's sum.
TEST(Fp8LinearCudaTest, ThePairOfProjectionsMatchesTheTwoApart_CUDA) {
  SKIP_WITHOUT_FP8();
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(23);
  const int64_t rows = 20005, in = 256, out1 = 256, out2 = 128;
  const auto x = torch::randn({1, rows, in}, cuda).to(torch::kBFloat16);
  const auto w1 = torch::randn({out1, in}, cuda) / std::sqrt(double(in));
  const auto b1 = torch::randn({out1}, cuda) * 0.1;
  const auto w2 = torch::randn({out2, in}, cuda) / std::sqrt(double(in));
  const auto b2 = torch::randn({out2}, cuda) * 0.1;
  const auto up1 = torch::randn({1, rows, out1}, cuda);
  const auto up2 = torch::randn({1, rows, out2}, cuda);
  {
    const Fp8On on;
    ASSERT_TRUE(fp8::linear_pair_applies(x, w1, w2));
  }
  const auto pair = run_fp8_pair(x, w1, b1, w2, b2, up1, up2, true);
  const auto apart = run_fp8_pair(x, w1, b1, w2, b2, up1, up2, false);
  EXPECT_TRUE(torch::equal(pair.y1, apart.y1));
  EXPECT_TRUE(torch::equal(pair.y2, apart.y2));
  EXPECT_TRUE(torch::equal(pair.gw1, apart.gw1));
  EXPECT_TRUE(torch::equal(pair.gb1, apart.gb1));
  EXPECT_TRUE(torch::equal(pair.gw2, apart.gw2));
  EXPECT_TRUE(torch::equal(pair.gb2, apart.gb2));
  EXPECT_LE(relative_error(pair.gx.to(torch::kFloat), apart.gx.to(torch::kFloat)), 4e-3);
  for (const auto* s : {&pair.s1, &apart.s1}) ASSERT_TRUE(s->history.defined());
  EXPECT_TRUE(torch::equal(pair.s1.history, apart.s1.history));
  EXPECT_TRUE(torch::equal(pair.s1.scale, apart.s1.scale));
  // The second Linear's weight and output-gradient rows.
  EXPECT_TRUE(torch::equal(pair.s2.history.narrow(0, 1, 2), apart.s2.history.narrow(0, 1, 2)));
  EXPECT_TRUE(torch::equal(pair.s2.scale.narrow(0, 1, 2), apart.s2.scale.narrow(0, 1, 2)));
  // Through linear.h's linear_pair, which the models call.
  {
    const Fp8On on;
    const torch::NoGradGuard no_grad;
    const auto [y1, y2] = linear_pair(x, w1, b1, w2, b2);
    EXPECT_TRUE(torch::equal(y1, fp8::linear(x, w1, b1)));
    EXPECT_TRUE(torch::equal(y2, fp8::linear(x, w2, b2)));
  }
}

#ifdef SLIPSTREAM_TEST_FP8_KERNELS
// The LayerNorm that writes only its output's e4m3 copies, against the
// LayerNorm kernel and then the cast, byte for byte: row-major and
// transposed copies (the padding rows zero), the amax, the mean and 1/std;
// and with no copies asked for, the amax and statistics alone. Both of the
// kernels' layouts (widths 256 and 1024, 448 and 640) and both tile heights
// (128 rows to width 512, 64 above), rows not a multiple of the tile.
TEST(Fp8LinearCudaTest, TheLayerNormsCastMatchesTheLayerNormThenTheCast_CUDA) {
  SKIP_WITHOUT_FP8();
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  const auto f32 = cuda.dtype(torch::kFloat);
  const auto u8 = cuda.dtype(torch::kUInt8);
  const auto stream = at::cuda::getCurrentCUDAStream().stream();
  for (const int64_t width : {256, 448, 640, 1024}) {
    torch::manual_seed(width);
    const int64_t rows = 20005, rows_out = 20016;
    const auto x = (torch::randn({rows, width}, cuda) * 3 + 1).to(torch::kBFloat16);
    const auto gamma = torch::randn({width}, f32), beta = torch::randn({width}, f32) * 0.1;
    const auto scale = torch::full({1}, 37.5, f32);
    auto y = torch::empty({rows, width}, cuda.dtype(torch::kBFloat16));
    auto mean = torch::empty({rows}, f32), rstd = torch::empty({rows}, f32);
    layer_norm_kernels::forward(x.data_ptr(), gamma.data_ptr<float>(), beta.data_ptr<float>(), rows,
                                width, 1e-5f, y.data_ptr(), mean.data_ptr<float>(),
                                rstd.data_ptr<float>(), stream);
    auto q = torch::empty({rows_out, width}, u8), q_t = torch::empty({width, rows_out}, u8);
    auto amax = torch::zeros({1}, f32);
    fp8_kernels::quantize(y.data_ptr(), false, rows, rows_out, width, scale.data_ptr<float>(),
                          fp8_kernels::Format::kE4M3, q.data_ptr<uint8_t>(),
                          q_t.data_ptr<uint8_t>(), amax.data_ptr<float>(), stream);
    // Filled with 0xff first: every byte, padding too, must be written.
    auto fq = torch::full({rows_out, width}, 255, u8),
         fq_t = torch::full({width, rows_out}, 255, u8);
    auto famax = torch::zeros({1}, f32);
    auto fmean = torch::empty({rows}, f32), frstd = torch::empty({rows}, f32);
    layer_norm_kernels::forward_e4m3(
        x.data_ptr(), gamma.data_ptr<float>(), beta.data_ptr<float>(), rows, rows_out, width, 1e-5f,
        scale.data_ptr<float>(), fq.data_ptr<uint8_t>(), fq_t.data_ptr<uint8_t>(),
        famax.data_ptr<float>(), fmean.data_ptr<float>(), frstd.data_ptr<float>(), stream);
    EXPECT_TRUE(torch::equal(fq, q)) << width;
    EXPECT_TRUE(torch::equal(fq_t, q_t)) << width;
    EXPECT_TRUE(
        torch::equal(fq.narrow(0, rows, rows_out - rows), torch::zeros({16 - 5, width}, u8)));
    EXPECT_EQ(famax.item<float>(), amax.item<float>()) << width;
    EXPECT_EQ(famax.item<float>(), y.abs().max().to(torch::kFloat).item<float>()) << width;
    EXPECT_TRUE(torch::equal(fmean, mean)) << width;
    EXPECT_TRUE(torch::equal(frstd, rstd)) << width;
    auto only = torch::zeros({1}, f32);
    layer_norm_kernels::forward_e4m3(x.data_ptr(), gamma.data_ptr<float>(), beta.data_ptr<float>(),
                                     rows, rows_out, width, 1e-5f, scale.data_ptr<float>(), nullptr,
                                     nullptr, only.data_ptr<float>(), fmean.data_ptr<float>(),
                                     frstd.data_ptr<float>(), stream);
    EXPECT_EQ(only.item<float>(), amax.item<float>()) << width;
  }
}
#endif

struct NormedRun {
  std::vector<torch::Tensor> outputs, grads;  // grads: x, ln weight, ln bias, w1, b1, w2, b2
  fp8::State s1, s2;
};

// Two steps of a residual block's LayerNorm and the fp8 products of its
// output, as one function (fused: norm_linear_pair or norm_gelu_mlp) or
// as fused_layer_norm_residual and the products apart, from a fresh
// scaling state: the second step's outputs, every gradient of
// sum(output_i * up_i) and the weights' scaling states.
NormedRun run_normed(bool mlp, bool fused, const torch::Tensor& x_in,
                     const std::vector<torch::Tensor>& params,
                     const std::vector<torch::Tensor>& up) {
  const Fp8On on;
  auto x = leaf(x_in);
  std::vector<torch::Tensor> p;
  for (const auto& t : params) p.push_back(leaf(t));
  const auto &lw = p[0], &lb = p[1], &w1 = p[2], &b1 = p[3], &w2 = p[4], &b2 = p[5];
  const int64_t c = x.size(-1);
  std::vector<torch::Tensor> out;
  for (int step = 0; step < 2; ++step) {
    std::vector<torch::Tensor*> all{&x};
    for (auto& t : p) all.push_back(&t);
    for (auto* t : all) t->mutable_grad() = torch::Tensor();
    fp8::update_scales();
    if (mlp) {
      if (fused) {
        out = {fp8::norm_gelu_mlp(x, lw, lb, 1e-5, w1, b1, w2, b2)};
      } else {
        const auto [n, r] = fused_layer_norm_residual(x, {c}, lw, lb, 1e-5);
        out = {fp8::gelu_mlp(n, w1, b1, w2, b2, r)};
      }
    } else if (fused) {
      const auto [y1, y2, r] = fp8::norm_linear_pair(x, lw, lb, 1e-5, w1, b1, w2, b2);
      out = {y1, y2, r};
    } else {
      const auto [n, r] = fused_layer_norm_residual(x, {c}, lw, lb, 1e-5);
      const auto [y1, y2] = fp8::linear_pair(n, w1, b1, w2, b2);
      out = {y1, y2, r};
    }
    auto loss = torch::zeros({}, up[0].options());
    for (size_t i = 0; i < out.size(); ++i) loss = loss + (out[i].to(torch::kFloat) * up[i]).sum();
    loss.backward();
  }
  NormedRun run;
  for (const auto& t : out) run.outputs.push_back(t.detach());
  run.grads.push_back(x.grad());
  for (const auto& t : p) run.grads.push_back(t.grad());
  run.s1 = fp8::state_of(w1);
  run.s2 = fp8::state_of(w2);
  return run;
}

// A residual block's LayerNorm as the prologue of its fp8 products (the
// attention's pair of input projections at the Transolver's width, the
// MLP at the GeoTransolver's), its output written only in e4m3, against
// fused_layer_norm_residual and the products apart: the outputs, x's and
// the products' gradients and the scaling states bitwise; the LayerNorm's
// weight and bias gradients (summed with atomics) to fp32 summation order.
TEST(Fp8LinearCudaTest, TheLayerNormBeforeTheProductsMatchesItApart_CUDA) {
  SKIP_WITHOUT_FP8();
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  for (const bool mlp : {false, true}) {
    torch::manual_seed(mlp ? 31 : 29);
    const int64_t rows = 20005, c = mlp ? 448 : 256, hidden = mlp ? 4 * c : c;
    const auto x = (torch::randn({1, rows, c}, cuda) * 2).to(torch::kBFloat16);
    const std::vector<torch::Tensor> params{
        torch::randn({c}, cuda) * 0.5 + 1,
        torch::randn({c}, cuda) * 0.1,
        torch::randn({hidden, c}, cuda) / std::sqrt(double(c)),
        torch::randn({hidden}, cuda) * 0.1,
        torch::randn({mlp ? c : hidden, mlp ? hidden : c}, cuda) / std::sqrt(double(c)),
        torch::randn({mlp ? c : hidden}, cuda) * 0.1};
    // The upstream gradients of the outputs: y (MLP); y1, y2 and r (pair).
    std::vector<torch::Tensor> up(mlp ? 1 : 3);
    up[0] = torch::randn({1, rows, mlp ? c : hidden}, cuda);
    if (!mlp) {
      up[1] = torch::randn({1, rows, hidden}, cuda);
      up[2] = torch::randn({1, rows, c}, cuda);
    }
    {
      const Fp8On on;
      ASSERT_TRUE(
          mlp ? fp8::norm_gelu_mlp_applies(x, params[0], params[1], params[2], params[4])
              : fp8::norm_linear_pair_applies(x, params[0], params[1], params[2], params[4]));
      // Not for an fp32 x, which the LayerNorm kernels do not take.
      EXPECT_FALSE(fp8::norm_linear_pair_applies(x.to(torch::kFloat), params[0], params[1],
                                                 params[2], params[4]));
    }
    const auto one = run_normed(mlp, true, x, params, up);
    const auto apart = run_normed(mlp, false, x, params, up);
    const char* what = mlp ? "mlp" : "pair";
    ASSERT_EQ(one.outputs.size(), apart.outputs.size());
    for (size_t i = 0; i < one.outputs.size(); ++i) {
      EXPECT_TRUE(torch::equal(one.outputs[i], apart.outputs[i])) << what << " output " << i;
    }
    const char* names[] = {"x", "ln weight", "ln bias", "w1", "b1", "w2", "b2"};
    for (size_t i = 0; i < one.grads.size(); ++i) {
      ASSERT_TRUE(one.grads[i].defined() && apart.grads[i].defined()) << what << " " << names[i];
      if (i == 1 || i == 2 || (mlp && i == 4)) {
        EXPECT_LE(relative_error(one.grads[i].to(torch::kFloat), apart.grads[i].to(torch::kFloat)),
                  1e-5)
            << what << " " << names[i];
      } else {
        EXPECT_TRUE(torch::equal(one.grads[i], apart.grads[i])) << what << " " << names[i];
      }
    }
    for (const auto& [a, b] : {std::pair{&one.s1, &apart.s1}, std::pair{&one.s2, &apart.s2}}) {
      ASSERT_TRUE(a->history.defined() && b->history.defined()) << what;
      EXPECT_TRUE(torch::equal(a->history, b->history)) << what;
      EXPECT_TRUE(torch::equal(a->scale, b->scale)) << what;
    }
  }
}

// A weight derived from a parameter at each call (GALE's per-head padded
// projections) keyed as the parameter by fp8::KeyAs: three steps, each on
// a new padded copy, make one Linear's scaling state, the parameter's,
// whose history holds the three steps' weight amaxes; without KeyAs each
// copy would have made a state of its own.
TEST(Fp8LinearCudaTest, APaddedCopyKeepsItsParametersScalingState_CUDA) {
  SKIP_WITHOUT_FP8();
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(37);
  const auto x = torch::randn({4000, 64}, cuda).to(torch::kBFloat16);
  auto w = leaf(torch::randn({56, 64}, cuda));
  const auto b = torch::zeros({64}, cuda);
  const Fp8On on;
  std::vector<float> amaxes;
  for (int step = 0; step < 3; ++step) {
    fp8::update_scales();
    {
      torch::NoGradGuard no_grad;
      w.mul_(1.5);  // a larger weight amax each step
    }
    const auto padded = torch::constant_pad_nd(w, {0, 0, 0, 8});  // (64, 64)
    amaxes.push_back(w.abs().max().item<float>());
    const fp8::KeyAs key(padded, w);
    fp8::linear(x, padded, b).to(torch::kFloat).sum().backward();
  }
  fp8::update_scales();
  EXPECT_EQ(fp8::linears(), 1);
  const auto state = fp8::state_of(w);
  ASSERT_TRUE(state.history.defined());
  const auto weight_history = state.history[1].cpu();
  for (const float a : amaxes) {
    EXPECT_TRUE(weight_history.eq(a).any().item<bool>()) << a;
  }
  // Without it: a state for the copy.
  const auto copy = torch::constant_pad_nd(w.detach(), {0, 0, 0, 8});
  fp8::linear(x, copy, b);
  EXPECT_EQ(fp8::linears(), 2);
}

// A weight made anew at each call without a KeyAs never inherits the
// scaling state of an earlier, freed one (whose TensorImpl the next copy's
// would otherwise often reuse): each copy gets its own.
TEST(Fp8LinearCudaTest, AFreedWeightsStateIsNotAnotherWeights_CUDA) {
  SKIP_WITHOUT_FP8();
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(41);
  const auto x = torch::randn({256, 64}, cuda).to(torch::kBFloat16);
  const auto w = torch::randn({64, 64}, cuda);
  const auto b = torch::zeros({64}, cuda);
  const Fp8On on;
  torch::NoGradGuard no_grad;
  for (int call = 0; call < 4; ++call) {
    const auto copy = w.clone();  // freed at the iteration's end
    fp8::linear(x, copy, b);
  }
  EXPECT_EQ(fp8::linears(), 4);
}

}  // namespace
}  // namespace slipstream::aero
