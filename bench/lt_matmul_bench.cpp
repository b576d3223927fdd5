// cuBLASLt's residual epilogue (lt_matmul.h) against the two ops it
// replaces, at the GeoTransolver volume layer's shapes, timed with the device
// synchronised around each run of reps. Usage: lt_matmul_bench [rows] [reps]
#include "aero/ops/lt_matmul.h"
#include "bench_timing.h"

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  using namespace slipstream;
  using namespace slipstream::aero;
  if (!bench::have_cuda("lt_matmul_bench")) return 0;
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 200000;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  const c10::Device dev(c10::kCUDA, 0);
  const auto opts = torch::dtype(torch::kBFloat16).device(dev);
  // Three warm-up runs: the first also runs cuBLASLt's heuristic.
  const auto time_ms = [&](const auto& run) { return bench::time_ms(dev, 3, reps, run); };
  for (const int64_t in : {448, 1792}) {
    const auto x = torch::randn({rows, in}, opts), w = torch::randn({448, in}, opts) * 0.03;
    const auto b = torch::randn({448}, opts), r = torch::randn({rows, 448}, opts);
    at::Tensor y;
    const double apart = time_ms([&] { y = at::linear(x, w, b) + r; });
    const double plain = time_ms([&] { y = at::linear(x, w, b); });
    bool applied = true;
    const double fused = time_ms([&] { applied = lt_matmul::linear_residual(x, w, b, r, y); });
    std::printf(
        "forward %lld x %lld -> 448: linear + add %.3f ms (linear alone %.3f), one GEMM with the "
        "residual %.3f ms%s\n",
        static_cast<long long>(rows), static_cast<long long>(in), apart, plain, fused,
        applied ? "" : " (DID NOT APPLY)");
  }
  return 0;
}
