#include "aero/train/bench.h"

#include "aero/config/config.h"
#include "aero/device/device.h"
#include "aero/device/kernel_profile.h"
#include "aero/train/trainer.h"
#include "core/distributed/process_group.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>

namespace slipstream::aero {

double BenchPolicyResult::median() const {
  auto v = ms_per_step;
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}
double BenchPolicyResult::min() const { return *std::min_element(ms_per_step.begin(), ms_per_step.end()); }
double BenchPolicyResult::max() const { return *std::max_element(ms_per_step.begin(), ms_per_step.end()); }

int run_bench(const std::string& config_dir, std::vector<std::string> overrides,
              const BenchOptions& o) {
  auto picks = [&](const std::string& group) {
    for (const auto& ov : overrides) {
      if (ov.rfind(group + "=", 0) == 0) return true;
    }
    return false;
  };
  if (!picks("model")) overrides.insert(overrides.begin(), "model=transolver_volume");
  if (!picks("dataset")) overrides.insert(overrides.begin(), "dataset=synthetic_volume");
  overrides.push_back("training.steps_per_epoch=" + std::to_string(o.warmup_steps + o.steps_per_round));
  overrides.push_back("training.validate=false");
  overrides.push_back("logging.tensorboard=false");
  TORCH_CHECK(o.rounds >= 1 && o.steps_per_round >= 1 && o.warmup_steps >= 0,
              "bench: need rounds >= 1, steps >= 1, warmup >= 0");
  const Config config = Config::load(config_dir, overrides);
  TrainSettings settings = resolve_settings(config);
  settings.run_id = "bench-" + settings.run_id;
  const DistributedEnv env = DistributedEnv::from_environment();
  ProcessGroupOptions pg;
  pg.timeout = std::chrono::seconds(settings.distributed_timeout_s);
  auto comm = init_process_group(env, resolve_device(settings.device, env.local_rank), pg);
  Trainer trainer(settings, config.to_yaml(), comm.get(), env.local_rank);
  const bool print = env.rank == 0;
  if (o.audit_syncs) trainer.set_sync_audit(true);
  const c10::Device device = trainer.device();
  std::map<std::string, BenchPolicyResult> results;
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
      const EpochResult r = trainer.train_epoch(epoch++);
      synchronize_device(device);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                                  timed_start)
                            .count() /
                        o.steps_per_round;
      auto& res = results[name];
      res.policy = name;
      res.ms_per_step.push_back(ms);
      res.peak_gib = std::max(res.peak_gib, r.peak_memory_gib);
    }
  }
  std::string profile_table;
  if (o.profile) {
    trainer.set_readback_policy(parse_readback_policy(o.policies.front()));
    std::filesystem::create_directories(settings.output_dir);
    const std::string trace = settings.output_dir + "/" + settings.run_id + "-kernel_trace.json";
    const auto times = profile_kernels(
        [&] {
          trainer.train_epoch(epoch++);
          synchronize_device(device);
        },
        trace);
    profile_table = "\nprofile (" + o.policies.front() + ", all " +
                    std::to_string(o.warmup_steps + o.steps_per_round) + " steps of a round; trace " +
                    trace + ")\n" +
                    format_kernel_table(times, o.warmup_steps + o.steps_per_round, 30);
  }
  if (!print) return 0;
  std::printf("%s", profile_table.c_str());
  std::printf("\nslipstream bench: %s (fused attention %s, bf16 layer norm %s), %lld points/step, "
              "%s, device %s x %d ranks, %d rounds x %d steps (after %d warm-up)\n",
              config.get<std::string>("defaults.model").c_str(),
              settings.model.fused_attention ? "on" : "off",
              settings.model.bf16_layer_norm ? "on" : "off",
              static_cast<long long>(settings.sampling_resolution), settings.optimizer.name.c_str(),
              device.str().c_str(), env.world_size, o.rounds, o.steps_per_round, o.warmup_steps);
  std::printf("%-10s %12s %12s %12s %10s\n", "policy", "median ms", "min ms", "max ms", "peak GiB");
  for (const auto& name : o.policies) {
    const auto& r = results[name];
    std::printf("%-10s %12.2f %12.2f %12.2f %10.2f\n", name.c_str(), r.median(), r.min(), r.max(),
                r.peak_gib);
  }
  for (const auto& name : o.policies) {
    const auto& r = results[name];
    nlohmann::json j{{"bench", "train_step"},      {"policy", name},
                     {"ms_per_step_median", r.median()}, {"ms_per_step_min", r.min()},
                     {"ms_per_step_max", r.max()},  {"ms_per_step_rounds", r.ms_per_step},
                     {"peak_gib", r.peak_gib},     {"device", device.str()},
                     {"model", config.get<std::string>("defaults.model")},
                     {"points", settings.sampling_resolution},
                     {"optimizer", settings.optimizer.name},
                     {"fused_attention", settings.model.fused_attention},
                     {"bf16_layer_norm", settings.model.bf16_layer_norm},
                     {"precision", device.is_cuda() ? "bf16" : "fp32"},
                     {"world_size", env.world_size}};
    std::cout << j.dump() << "\n";
  }
  if (o.audit_syncs) std::cout << trainer.sync_audit_report();
  return 0;
}

}  // namespace slipstream::aero
