// Host cost of one step's readback: start() plus delivering the landed step,
// ~20 scalars, CPU tensors (goal: <= 20 us per step). On CPU the copy lands
// at once, so this times the packing, the stack/convert and the delivery.
// Masked metrics carry fp32 counts, as the recipe's loss code makes them.
#include "core/readback/step_readback.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

namespace {

slipstream::StepScalars make_scalars(int n, bool masked) {
  slipstream::StepScalars s;
  for (int i = 0; i < n; ++i) {
    const std::string key = "metric_" + std::to_string(i);
    if (masked && i % 2 == 1) {
      s.add_counted(key, at::rand({}), at::full({}, 100.0f));
    } else {
      s.add(key, at::rand({}));
    }
  }
  return s;
}

void BM_StartAndDeliver(benchmark::State& state) {
  at::set_num_threads(1);
  const auto scalars = make_scalars(static_cast<int>(state.range(0)), state.range(1) != 0);
  double sink = 0;
  slipstream::StepReadback readback(
      [&](const slipstream::StepRecord& r) { sink += r.values.front().second; });
  int64_t step = 0;
  for (auto _ : state) {
    readback.start(step++, scalars, {{"lr", 1e-3}, {"step_time_s", 0.1}});
    readback.deliver_landed();
  }
  benchmark::DoNotOptimize(sink);
}
BENCHMARK(BM_StartAndDeliver)->Args({20, 0})->Args({20, 1})->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
