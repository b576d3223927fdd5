// slipstream bench: times training steps for each readback policy
// (blocking: the reduction then .cpu() after each step, as a loop that waits
// for the GPU does; async: the non-blocking readback; none: no readback) side
// by side in one process. Policies are interleaved over several rounds; each
// round runs `warmup` untimed steps then `steps` timed ones, through the real
// loader. A round's figure is the wall time from the first timed step to the
// end of the last (device work included), divided by the steps. Prints a
// table and one JSON line per policy. Unless the overrides pick them, the
// model and dataset are the volume recipe's (transolver_volume,
// synthetic_volume: 200k points).
#include "aero/ops/numerics_settings.h"
#include "aero/train/run.h"
#include "aero/train/trainer.h"
#include "commands/commands.h"
#include "commands/tables.h"
#include "core/device/device.h"
#include "core/device/kernel_profile.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

namespace slipstream::app {

namespace {

struct BenchOptions {
  int rounds = 3;
  int steps_per_round = 20;
  int warmup_steps = 10;
  std::vector<std::string> policies{"blocking", "async", "none"};
  bool audit_syncs = false;
  // After the timed rounds, one more round of the first policy under the
  // Kineto profiler: device time per kernel and step, and the Chrome trace.
  bool profile = false;
  std::vector<std::string> overrides;
};

struct PolicyResult {
  std::vector<double> ms_per_step;  // one per round
  double peak_gib = 0.0;
  double median() const {
    auto v = ms_per_step;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  }
  double min() const { return *std::min_element(ms_per_step.begin(), ms_per_step.end()); }
  double max() const { return *std::max_element(ms_per_step.begin(), ms_per_step.end()); }
};

int run_bench(const CommandContext& context, BenchOptions o) {
  auto picks = [&](const std::string& group) {
    return std::any_of(o.overrides.begin(), o.overrides.end(),
                       [&](const std::string& ov) { return ov.rfind(group + "=", 0) == 0; });
  };
  auto& ov = o.overrides;
  if (!picks("model")) ov.insert(ov.begin(), "model=transolver_volume");
  if (!picks("dataset")) ov.insert(ov.begin(), "dataset=synthetic_volume");
  ov.push_back("training.steps_per_epoch=" + std::to_string(o.warmup_steps + o.steps_per_round));
  ov.push_back("training.validate=false");
  ov.push_back("logging.tensorboard=false");
  TORCH_CHECK(o.rounds >= 1 && o.steps_per_round >= 1 && o.warmup_steps >= 0,
              "bench: need rounds >= 1, steps >= 1, warmup >= 0");
  TORCH_CHECK(!o.policies.empty(), "bench: --policies names none");
  for (const auto& p : o.policies) parse_readback_policy(p);  // a bad name fails before any work
  const auto config = aero::Config::load(context.config_dir, ov);
  auto run = aero::build_run(config, DistributedEnv::from_environment());
  run->spec.settings.run_id = "bench-" + run->spec.settings.run_id;
  aero::Trainer trainer(*run);
  if (o.audit_syncs) trainer.set_sync_audit(true);
  const c10::Device device = run->device;
  std::map<std::string, PolicyResult> results;
  std::chrono::steady_clock::time_point timed_start;
  trainer.set_step_hook([&](int64_t i) {
    if (i == o.warmup_steps) {
      synchronize_device(device);  // outside the timed region's work
      timed_start = std::chrono::steady_clock::now();
    }
  });
  int64_t epoch = 1;
  for (int round = 0; round < o.rounds; ++round) {
    for (const auto& name : o.policies) {
      trainer.set_readback_policy(parse_readback_policy(name));
      const auto r = trainer.train_epoch(epoch++);
      synchronize_device(device);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - timed_start)
              .count() /
          o.steps_per_round;
      auto& res = results[name];
      res.ms_per_step.push_back(ms);
      res.peak_gib = std::max(res.peak_gib, r.peak_memory_gib);
    }
  }
  const auto& s = run->settings();
  const int steps = o.warmup_steps + o.steps_per_round;
  std::string profile_table;
  if (o.profile) {
    trainer.set_readback_policy(parse_readback_policy(o.policies.front()));
    std::filesystem::create_directories(s.output_dir);
    const std::string trace = s.output_dir + "/" + s.run_id + "-kernel_trace.json";
    const auto times = profile_kernels(
        [&] {
          trainer.train_epoch(epoch++);
          synchronize_device(device);
        },
        trace);
    profile_table = "\nprofile (" + o.policies.front() + ", all " + std::to_string(steps) +
                    " steps of a round; trace " + trace + ")\n" +
                    format_kernel_table(times, steps, 30);
  }
  if (run->rank != 0) return 0;
  const std::string model = run->spec.model_config;
  const nlohmann::json numerics =
      aero::numerics_record(*run->model, device, run->bf16(), run->config);
  const std::string precision = aero::to_string(run->precision);
  std::printf("%s", profile_table.c_str());
  std::printf(
      "\nslipstream bench: %s (%s), %lld points/step, %s, %s, device %s x %d ranks, "
      "%d rounds x %d steps (after %d warm-up)\n",
      model.c_str(), numerics.dump().c_str(), static_cast<long long>(s.sampling_resolution),
      s.optimizer.name.c_str(), precision.c_str(), device.str().c_str(), run->world_size, o.rounds,
      o.steps_per_round, o.warmup_steps);
  std::printf("%-10s %12s %12s %12s %10s\n", "policy", "median ms", "min ms", "max ms", "peak GiB");
  for (const auto& name : o.policies) {
    const auto& r = results[name];
    std::printf("%-10s %12.2f %12.2f %12.2f %10.2f\n", name.c_str(), r.median(), r.min(), r.max(),
                r.peak_gib);
  }
  for (const auto& name : o.policies) {
    const auto& r = results[name];
    nlohmann::json j{{"bench", "train_step"},
                     {"policy", name},
                     {"ms_per_step_median", r.median()},
                     {"ms_per_step_min", r.min()},
                     {"ms_per_step_max", r.max()},
                     {"ms_per_step_rounds", r.ms_per_step},
                     {"peak_gib", r.peak_gib},
                     {"device", device.str()},
                     {"model", model},
                     {"points", s.sampling_resolution},
                     {"optimizer", s.optimizer.name},
                     {"numerics", numerics},
                     {"precision", precision},
                     {"world_size", run->world_size}};
    std::cout << j.dump() << "\n";
  }
  if (o.audit_syncs) std::cout << trainer.sync_audit_report();
  return 0;
}

}  // namespace

Command add_bench(CLI::App& app, const CommandContext& context) {
  auto o = std::make_shared<BenchOptions>();
  auto* sub = app.add_subcommand("bench", "time train steps per readback policy");
  sub->add_option("--rounds", o->rounds, "rounds of interleaved policies");
  sub->add_option("--steps", o->steps_per_round, "timed steps per policy and round");
  sub->add_option("--warmup", o->warmup_steps, "untimed steps before each timed block");
  // One argument, comma-separated, so that overrides after it stay overrides.
  sub->add_option_function<std::string>(
      "--policies",
      [o](const std::string& list) {
        o->policies.clear();
        std::stringstream ss(list);
        for (std::string p; std::getline(ss, p, ',');) o->policies.push_back(p);
      },
      "readback policies to compare, comma-separated (default blocking,async,none)");
  sub->add_flag("--audit-syncs", o->audit_syncs, "count synchronizing CUDA calls");
  sub->add_flag("--profile", o->profile, "then profile one round: device time per kernel and step");
  sub->add_option("overrides", o->overrides, "key=value config overrides");
  return {sub, [o, &context] { return run_bench(context, *o); }};
}

}  // namespace slipstream::app
