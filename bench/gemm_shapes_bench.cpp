// The volume models' Linear GEMMs, each in its three roles (forward x w^T +
// b, input gradient dy w, weight gradient dy^T x in fp32), in bf16
// (lt_matmul::mm, tuned) and in fp8 (lt_matmul::scaled_mm: e4m3 x e4m3
// forward, e5m2 x e4m3 input gradient, e5m2 x e4m3 weight gradient, as
// precision: fp8 runs them), against this device's own ceilings measured
// first: a large bf16 and fp8 GEMM's rate and a device-to-device copy's
// bandwidth. Each row's "roof" is the larger of its FLOPs at the GEMM rate
// and its bytes (operands read once, output written once) at the copy
// bandwidth; "of roof" is that over the time taken, so 100 % is as fast as
// the device allows a GEMM to run. Then a step's sum over the blocks
// (12 layers, every Linear of a block in its three roles).
// Usage: gemm_shapes_bench [rows] [reps]
#include "aero/ops/lt_matmul.h"
#include "bench_timing.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define GEMM_SHAPES_FP8 1
#endif

namespace {

using namespace slipstream;
using namespace slipstream::aero;

struct Ceilings {
  double bf16_tflops = 0, fp8_tflops = 0, copy_gbs = 0;
};

struct Gemm {
  const char* name;
  int64_t in, out;
};

struct ModelGemms {
  const char* name;
  int layers;
  std::vector<Gemm> linears;
};

struct Timed {
  double ms = 0, roof_ms = 0;
  bool aten = false;  // lt_matmul declined: ATen's GEMM timed instead
};

// The larger of the compute and the memory time at the measured ceilings.
double roof_ms(double flops, double bytes, double tflops, const Ceilings& c) {
  return std::max(flops / (tflops * 1e12), bytes / (c.copy_gbs * 1e9)) * 1e3;
}

void print_row(const std::string& what, const Timed& t, double flops, double bytes) {
  std::printf("%-34s %8.3f ms %7.1f TFLOP/s %7.1f GB/s  roof %7.3f ms  %5.1f %% of roof%s\n",
              what.c_str(), t.ms, flops / (t.ms * 1e-3) / 1e12, bytes / (t.ms * 1e-3) / 1e9,
              t.roof_ms, 100.0 * t.roof_ms / t.ms, t.aten ? "  (ATen's GEMM)" : "");
}

}  // namespace

int main(int argc, char** argv) {
  if (!bench::have_cuda("gemm_shapes_bench")) return 0;
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 200000;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  const c10::Device dev(c10::kCUDA, 0);
  const auto bf = torch::dtype(torch::kBFloat16).device(dev);
  lt_matmul::set_mode(lt_matmul::Mode::tuned);
  // Three warm-up runs: the first also tunes the problem's algorithm.
  const auto time_ms = [&](const auto& run) { return bench::time_ms(dev, 3, reps, run); };

  Ceilings c;
  {
    const auto src = torch::empty({int64_t(1) << 30}, bf), dst = torch::empty_like(src);
    const double ms = time_ms([&] { dst.copy_(src); });
    c.copy_gbs = 2.0 * 2.0 * double(src.numel()) / (ms * 1e-3) / 1e9;
    const int64_t s = 8192;
    const auto a = torch::randn({s, s}, bf), b = torch::randn({s, s}, bf);
    at::Tensor out;
    const double gms = time_ms([&] { out = at::mm(a, b); });
    c.bf16_tflops = 2.0 * double(s) * s * s / (gms * 1e-3) / 1e12;
#ifdef GEMM_SHAPES_FP8
    const auto a8 = a.to(at::ScalarType::Float8_e4m3fn);
    const auto b8 = b.t().contiguous().to(at::ScalarType::Float8_e4m3fn);
    const auto one = torch::ones({1}, torch::dtype(torch::kFloat).device(dev));
    bool ok = true;
    const double fms = time_ms([&] {
      ok = lt_matmul::scaled_mm(a8, b8.t(), one, one, {}, {}, out, at::kBFloat16, true) && ok;
    });
    c.fp8_tflops = ok ? 2.0 * double(s) * s * s / (fms * 1e-3) / 1e12 : 0.0;
#endif
  }
  std::printf(
      "ceilings: copy %.0f GB/s (read + write), bf16 GEMM %.1f TFLOP/s, fp8 GEMM %.1f "
      "TFLOP/s (8192^3, random data)\n",
      c.copy_gbs, c.bf16_tflops, c.fp8_tflops);

  // The volume configs' Linears a block runs at every point (widths: the
  // Transolver 256, the GeoTransolver 256 + 6 x 32 = 448; MLP ratio 4).
  const std::vector<ModelGemms> models = {
      {"transolver_volume",
       12,
       {{"in_project (x, fx)", 256, 512},
        {"out_linear", 256, 256},
        {"mlp fc1", 256, 1024},
        {"mlp fc2", 1024, 256}}},
      {"geotransolver_volume",
       12,
       {{"in_project (x, fx)", 448, 896},
        {"out_linear", 448, 448},
        {"mlp fc1", 448, 1792},
        {"mlp fc2", 1792, 448}}},
  };
  for (const auto& m : models) {
    double step_ms[2] = {0, 0}, step_roof[2] = {0, 0};
    std::printf("\n%s, %lld rows:\n", m.name, static_cast<long long>(rows));
    for (const auto& l : m.linears) {
      const int64_t k = l.in, n = l.out;
      const auto x = torch::randn({rows, k}, bf), w = torch::randn({n, k}, bf) * 0.05;
      const auto bias = torch::randn({n}, bf), dy = torch::randn({rows, n}, bf);
      const double flops = 2.0 * double(rows) * double(k) * double(n);
      const double rk = double(rows) * double(k), rn = double(rows) * double(n),
                   kn = double(k) * double(n);
      // bf16: the output bf16 but the weight gradient's fp32.
      const double bytes16[3] = {2 * (rk + kn + rn), 2 * (rn + kn + rk), 2 * (rn + rk) + 4 * kn};
      Timed t16[3];
      at::Tensor out;
      const auto bf16_role = [&](int role, const at::Tensor& a, const at::Tensor& b,
                                 const at::Tensor& bb, at::ScalarType dt) {
        bool applied = true;
        t16[role].ms = time_ms([&] { applied = lt_matmul::mm(a, b, bb, {}, out, dt); });
        if (!applied) {
          t16[role].aten = true;
          t16[role].ms = time_ms([&] {
            out = bb.defined() ? at::addmm(bb, a, b) : at::mm(a, b);
            if (dt == at::kFloat) out = out.to(at::kFloat);
          });
        }
        out = at::Tensor();
        t16[role].roof_ms = roof_ms(flops, bytes16[role], c.bf16_tflops, c);
      };
      bf16_role(0, x, w.t(), bias, at::kBFloat16);
      bf16_role(1, dy, w, {}, at::kBFloat16);
      bf16_role(2, dy.t(), x, {}, at::kFloat);
      const char* roles[3] = {"forward", "input gradient", "weight gradient"};
      for (int r = 0; r < 3; ++r) {
        print_row(std::string("bf16 ") + l.name + " " + roles[r], t16[r], flops, bytes16[r]);
        step_ms[0] += m.layers * t16[r].ms;
        step_roof[0] += m.layers * t16[r].roof_ms;
      }
#ifdef GEMM_SHAPES_FP8
      if (c.fp8_tflops > 0) {
        // fp8: operands one byte; outputs bf16, the weight gradient's fp32.
        const double bytes8[3] = {rk + kn + 2 * rn, rn + kn + 2 * rk, rn + rk + 4 * kn};
        const auto e4 = at::ScalarType::Float8_e4m3fn, e5 = at::ScalarType::Float8_e5m2;
        const auto x8 = x.to(e4), xt8 = x.t().contiguous().to(e4);
        const auto w8 = w.to(e4), wt8 = w.t().contiguous().to(e4);
        const auto dy8 = dy.to(e5), dyt8 = dy.t().contiguous().to(e5);
        const auto one = torch::ones({1}, torch::dtype(torch::kFloat).device(dev));
        Timed t8[3];
        const auto fp8_role = [&](int role, const at::Tensor& a, const at::Tensor& b,
                                  const at::Tensor& bb, at::ScalarType dt, bool fast) {
          bool applied = true;
          t8[role].ms = time_ms(
              [&] { applied = lt_matmul::scaled_mm(a, b, one, one, bb, {}, out, dt, fast); });
          out = at::Tensor();
          t8[role].roof_ms = roof_ms(flops, bytes8[role], c.fp8_tflops, c);
          if (!applied) t8[role].ms = 0;
        };
        fp8_role(0, x8, w8.t(), bias, at::kBFloat16, true);
        fp8_role(1, dy8, wt8.t(), {}, at::kBFloat16, false);
        fp8_role(2, dyt8, xt8.t(), {}, at::kFloat, false);
        for (int r = 0; r < 3; ++r) {
          if (t8[r].ms == 0) {
            std::printf("fp8 %s %s: cuBLASLt declined\n", l.name, roles[r]);
            continue;
          }
          print_row(std::string("fp8  ") + l.name + " " + roles[r], t8[r], flops, bytes8[r]);
          step_ms[1] += m.layers * t8[r].ms;
          step_roof[1] += m.layers * t8[r].roof_ms;
        }
      }
#endif
    }
    std::printf(
        "%s, a step's block GEMMs (%d layers): bf16 %.2f ms (roof %.2f), fp8 %.2f ms "
        "(roof %.2f)\n",
        m.name, m.layers, step_ms[0], step_roof[0], step_ms[1], step_roof[1]);
  }
  return 0;
}
