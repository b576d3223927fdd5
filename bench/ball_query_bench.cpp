// The ball query alone on a GPU: the volume GeoTransolver's six scales over
// N points of a synthetic sample (scaled by its L_ref, as training sees
// them), timed with the device synchronised around each. Usage:
// ball_query_bench [N] [reps]
#include "aero/data/synthetic.h"
#include "aero/ops/ball_query.h"
#include "bench_timing.h"

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  using namespace slipstream;
  using namespace slipstream::aero;
  if (!bench::have_cuda("ball_query_bench")) return 0;
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 200000;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 3;
  SyntheticOptions o;
  o.points_per_sample = n;
  const Sample s = make_synthetic_sample(0, o);
  const c10::Device dev(c10::kCUDA, 0);
  const auto points =
      (s.point("points") / s.global_scalar("L_ref", 1.0)).unsqueeze(0).to(dev).contiguous();
  const double radii[] = {0.01, 0.05, 0.25, 1.0, 2.5, 5.0};
  const int64_t ks[] = {8, 16, 32, 32, 64, 128};
  const auto time_ms = [&](const auto& run) { return bench::time_ms(dev, 1, reps, run); };
  double total = 0;
  std::vector<BallQueryScale> scales;
  for (int i = 0; i < 6; ++i) {
    scales.push_back({radii[i], ks[i]});
    const double ms = time_ms([&] { ball_query(points, points, radii[i], ks[i]); });
    total += ms;
    std::printf("ball query N %lld radius %.2f K %3lld: %9.2f ms\n", static_cast<long long>(n),
                radii[i], static_cast<long long>(ks[i]), ms);
  }
  std::printf("ball query, six scales one at a time: %.2f ms per step\n", total);
  const double together = time_ms([&] { ball_query_scales(points, points, scales); });
  std::printf("ball query, six scales from one search (what the model runs): %.2f ms per step\n",
              together);
  for (int64_t per_cell : {2, 4, 8, 16, 32, 64}) {
    const double ms =
        time_ms([&] { ball_query_scales(points, points, scales, int64_t{1} << 28, per_cell); });
    std::printf("ball query, six scales from one search, %lld points a cell: %.2f ms\n",
                static_cast<long long>(per_cell), ms);
  }
  return 0;
}
