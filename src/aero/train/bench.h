// `slipstream bench`: times training steps for each readback policy
// (blocking: a .cpu() after each step, as before the seed's change; async:
// ours; none: no readback) side by side in one process. Policies are
// interleaved over several rounds; each round runs `warmup` untimed steps
// then `steps` timed ones, through the real loader. A round's figure is the
// wall time from the first timed step to the end of the last (device work
// included), divided by the steps. Prints a table and one JSON line per
// policy. Unless the overrides pick them, the model and dataset are the
// volume recipe's (transolver_volume, synthetic_volume: 200k points).
#pragma once

#include <string>
#include <vector>

namespace slipstream::aero {

struct BenchOptions {
  int rounds = 3;
  int steps_per_round = 20;
  int warmup_steps = 10;
  std::vector<std::string> policies{"blocking", "async", "none"};
  bool audit_syncs = false;
  // After the timed rounds, one more round of the first policy under the
  // Kineto profiler: prints device time per kernel and step, and writes the
  // Chrome trace beside the run directories.
  bool profile = false;
};

struct BenchPolicyResult {
  std::string policy;
  std::vector<double> ms_per_step;  // one per round
  double peak_gib = 0.0;
  double median() const;
  double min() const;
  double max() const;
};

int run_bench(const std::string& config_dir, std::vector<std::string> overrides,
              const BenchOptions& options);

}  // namespace slipstream::aero
