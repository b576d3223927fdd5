// Times the fused slice kernels one by one on the GPU, on the volume
// recipe's shapes (B 1, N 200k, H 8, D 32, G 256 unless given; GeoTransolver's
// GALE layers have D 56), and one physics-attention layer's forward +
// backward, fused against plain, with its peak memory; also the bias
// gradient's column sum on (points, 256) and (points, 1024).
// Usage: slice_kernels_bench [points] [reps] [dim_head] [wgmma|mma]
// (the last: the kernel form on Hopper, numerics.slice_kernels).
//
// A kernel's FLOPs count its tensor-core matrix products (2 per multiply-
// add), its bytes the global memory it must read and write (the recomputed
// points x slices weights never touch it). Figures are wall time over `reps`
// back-to-back launches after warm-up, divided by reps.
#include "aero/kernels/slice/slice_kernels.h"
#include "aero/model/transolver/transolver.h"
#include "aero/ops/linear.h"
#include "aero/ops/slice_ops.h"
#include "core/device/device.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

using namespace slipstream;
using namespace slipstream::aero;

namespace {

double time_ms(const std::function<void()>& fn, int reps) {
  for (int i = 0; i < 3; ++i) fn();
  torch::cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  torch::cuda::synchronize();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(t1 - t0).count() / reps;
}

void report(const char* name, double ms, double gemms, double bytes, double mac) {
  const double tflops = gemms * 2.0 * mac / (ms * 1e-3) / 1e12;
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  std::printf("%-14s %8.3f ms  %7.1f TFLOP/s (%4.1f%% of 790)  %7.1f GB/s (%4.1f%% of 4300)\n",
              name, ms, tflops, 100.0 * tflops / 790.0, gbs, 100.0 * gbs / 4300.0);
}

}  // namespace

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "slice_kernels_bench: no CUDA device\n");
    return 1;
  }
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 200000;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  const int64_t d = argc > 3 ? std::atoll(argv[3]) : 32;
  const std::string form = argc > 4 ? argv[4] : "wgmma";
  if (form != "wgmma" && form != "mma") {
    std::fprintf(stderr, "slice_kernels_bench: kernel form '%s', expected wgmma or mma\n",
                 form.c_str());
    return 1;
  }
  slipstream::aero::slice_kernels::set_mma_only(form == "mma");
  if (!slice_ops::kernels_apply(torch::Device(torch::kCUDA), torch::kBFloat16, d, 256)) {
    std::fprintf(stderr, "slice_kernels_bench: the kernels do not take dim_head %ld\n", long(d));
    return 1;
  }
  const int64_t b = 1, h = 8, g = 256, c = h * d;
  torch::manual_seed(0);
  const auto bf = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  const auto f32 = torch::dtype(torch::kFloat).device(torch::kCUDA);
  const auto x = torch::randn({b, n, h, d}, bf), fx = torch::randn({b, n, h, d}, bf);
  const auto gout = torch::randn({b, n, h, d}, bf);
  const slice_ops::Weights in{x, torch::randn({g, d}, f32) / std::sqrt(double(d)),
                              torch::randn({g}, f32) * 0.1, torch::linspace(0.5, 1.0, h, f32)};
  const auto os = torch::randn({b, h, g, d}, bf), gs = torch::randn({b, h, g, d}, f32);
  const auto gnorm = torch::randn({b, h, g}, f32);
  auto lse = slice_ops::reduce_first(in, fx).lse;

  const double mac = double(b) * n * h * g * d;  // one points x slices x dim product
  const double row = double(b) * n * h * d * 2;  // one (B, N, H, D) bf16 tensor
  const double lse_bytes = double(b) * n * h * 4;
  std::printf("slice kernels: B %ld N %ld H %ld D %ld G %ld, %d reps\n", long(b), long(n), long(h),
              long(d), long(g), reps);
  report("reduce_first", time_ms([&] { slice_ops::reduce_first(in, fx); }, reps), 2,
         2 * row + lse_bytes, mac);
  report("expand", time_ms([&] { slice_ops::expand(in, lse, os); }, reps), 2, 2 * row + lse_bytes,
         mac);
  report("reduce", time_ms([&] { slice_ops::reduce(in, lse, gout); }, reps), 2, 2 * row + lse_bytes,
         mac);
  report("backward", time_ms([&] { slice_ops::backward(in, lse, fx, gout, os, gs, gnorm); }, reps),
         6, 5 * row + lse_bytes, mac);

  for (const int64_t width : {c, 4 * c}) {
    const auto m = torch::randn({n, width}, bf);
    const std::string name = "column_sum " + std::to_string(width);
    report(name.c_str(), time_ms([&] { column_sum(m); }, reps), 0, double(n) * width * 2, 0);
  }

  // One layer, forward + backward, as the trainer runs it (bf16 autocast).
  TransolverOptions o;
  o.n_hidden = c;
  o.n_head = h;
  o.slice_num = g;
  PhysicsAttention layer(o);
  layer->to(torch::kCUDA);
  const auto xin = torch::randn({b, n, c}, f32);
  const c10::Device dev(torch::kCUDA, 0);
  for (bool fused : {false, true}) {
    layer->fused = fused;
    auto run = [&] {
      auto xi = xin.detach().requires_grad_(true);
      torch::Tensor out;
      {
        AutocastGuard autocast(dev, true);
        out = layer->forward(xi);
      }
      out.to(torch::kFloat).sum().backward();
    };
    run();
    torch::cuda::synchronize();
    reset_peak_memory(dev);
    const double ms = time_ms(run, reps / 2 > 0 ? reps / 2 : 1);
    std::printf("layer %-6s   %8.3f ms forward+backward, peak %.2f GiB\n",
                fused ? "fused" : "plain", ms, peak_memory_gib(dev));
  }
  return 0;
}
