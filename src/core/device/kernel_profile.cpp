#include "core/device/kernel_profile.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>

namespace slipstream {

std::vector<KernelTime> profile_kernels(const std::function<void()>& work,
                                        const std::string& trace_path) {
  namespace impl = torch::profiler::impl;
  namespace prof = torch::autograd::profiler;
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/true);
  const std::set<impl::ActivityType> activities{impl::ActivityType::CPU, impl::ActivityType::CUDA};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  try {
    work();
  } catch (...) {
    prof::disableProfiler();
    throw;
  }
  auto result = prof::disableProfiler();
  result->save(trace_path);
  return kernel_times_from_trace(trace_path);
}

std::vector<KernelTime> kernel_times_from_trace(const std::string& trace_path) {
  std::ifstream in(trace_path);
  TORCH_CHECK(in.good(), "profile: cannot read trace '", trace_path, "'");
  nlohmann::json trace;
  try {
    in >> trace;
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, "profile: trace '", trace_path, "' is not JSON: ", e.what());
  }
  std::map<std::string, KernelTime> by_name;
  for (const auto& e : trace.value("traceEvents", nlohmann::json::array())) {
    const auto cat = e.value("cat", std::string());
    if (cat != "kernel" && cat != "gpu_memcpy" && cat != "gpu_memset") continue;
    auto& k = by_name[e.value("name", std::string("?"))];
    k.name = e.value("name", std::string("?"));
    k.calls += 1;
    k.total_us += e.value("dur", 0.0);
  }
  std::vector<KernelTime> out;
  out.reserve(by_name.size());
  for (auto& [name, k] : by_name) out.push_back(std::move(k));
  std::sort(out.begin(), out.end(),
            [](const KernelTime& a, const KernelTime& b) { return a.total_us > b.total_us; });
  return out;
}

}  // namespace slipstream
