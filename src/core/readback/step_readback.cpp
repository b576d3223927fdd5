#include "core/readback/step_readback.h"

#include "core/distributed/communicator.h"

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <iostream>
#include <limits>
#include <thread>

namespace slipstream {

ReadbackPolicy parse_readback_policy(const std::string& name) {
  if (name == "async") return ReadbackPolicy::kAsync;
  if (name == "blocking") return ReadbackPolicy::kBlocking;
  if (name == "none") return ReadbackPolicy::kNone;
  TORCH_CHECK(false, "readback policy '", name, "' is not one of: async, blocking, none");
}

std::string to_string(ReadbackPolicy policy) {
  switch (policy) {
    case ReadbackPolicy::kAsync:
      return "async";
    case ReadbackPolicy::kBlocking:
      return "blocking";
    case ReadbackPolicy::kNone:
      return "none";
  }
  return "unknown";
}

LandingProbe event_landing_probe() {
  LandingProbe probe;
  probe.has_landed = [](const PendingStep& p) { return !p.event.has_value() || p.event->query(); };
  // c10::Event has no portable host wait across LibTorch versions; polling
  // the query is the only host wait in the readback, and runs at drain only.
  probe.wait = [](const PendingStep& p) {
    if (!p.event.has_value()) return;
    while (!p.event->query()) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  };
  return probe;
}

at::Tensor reduce_step_scalars(const StepScalars& scalars, Communicator* comm, int64_t step) {
  const auto& entries = scalars.entries();
  TORCH_CHECK(!entries.empty(), "readback: step ", step, " has no values");
  const auto device = entries.front().value.device();
  // Readback order: unmasked values first, then counted ones, so that the
  // counts line up with one contiguous slice (few kernels per step).
  std::vector<at::Tensor> values;
  std::vector<at::Tensor> counts;
  values.reserve(entries.size());
  bool same_dtype = true;
  bool same_count_dtype = true;
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& e : entries) {
      if (e.finite_count.defined() != (pass == 1)) continue;
      TORCH_CHECK(e.value.defined(), "readback: step ", step, " key '", e.key,
                  "' has an undefined tensor");
      TORCH_CHECK(e.value.dim() == 0, "readback: step ", step, " key '", e.key,
                  "' must be a 0-d tensor, got shape ", e.value.sizes());
      TORCH_CHECK(e.value.device() == device, "readback: step ", step, " key '", e.key, "' is on ",
                  e.value.device(), ", expected ", device);
      same_dtype &= e.value.scalar_type() == entries.front().value.scalar_type();
      values.push_back(e.value);
      if (pass == 1) {
        TORCH_CHECK(e.finite_count.dim() == 0, "readback: step ", step, " key '", e.key,
                    "' finite-target count must be a 0-d tensor, got shape ",
                    e.finite_count.sizes());
        TORCH_CHECK(e.finite_count.device() == device, "readback: step ", step, " key '", e.key,
                    "' count is on ", e.finite_count.device(), ", expected ", device);
        same_count_dtype &=
            counts.empty() || e.finite_count.scalar_type() == counts.front().scalar_type();
        counts.push_back(e.finite_count);
      }
    }
  }
  auto stack_as_double = [](std::vector<at::Tensor>& ts, bool same) {
    if (same) return at::stack(ts).to(at::kDouble);
    for (auto& t : ts) t = t.to(at::kDouble);
    return at::stack(ts);
  };
  const bool distributed = comm != nullptr && comm->world_size() > 1;
  if (counts.empty()) {
    at::Tensor v = stack_as_double(values, same_dtype);
    // Unmasked: the step's own values; summed over ranks if distributed.
    if (distributed) comm->all_reduce_sum(v);
    return v;
  }
  const int64_t k = static_cast<int64_t>(values.size());
  const int64_t m = static_cast<int64_t>(counts.size());
  at::Tensor v;
  at::Tensor c;
  if (same_dtype && same_count_dtype &&
      counts.front().scalar_type() == values.front().scalar_type()) {
    // Counts of the values' dtype (e.g. fp32 sums of a mask): one stack.
    values.insert(values.end(), counts.begin(), counts.end());
    at::Tensor all = at::stack(values).to(at::kDouble);
    v = all.slice(0, 0, k);
    c = all.slice(0, k, k + m);
  } else {
    v = stack_as_double(values, same_dtype);
    c = stack_as_double(counts, same_count_dtype);
  }
  // A rank with no finite target contributes nothing (its value may be NaN).
  at::Tensor weighted = at::where(c > 0, v.slice(0, k - m, k) * c, 0.0);
  at::Tensor buffer = at::cat({v.slice(0, 0, k - m), weighted, c});
  if (distributed) comm->all_reduce_sum(buffer);
  return buffer;
}

StepReadback::StepReadback(Deliver deliver, Options options)
    : deliver_(std::move(deliver)), options_(std::move(options)) {
  TORCH_CHECK(deliver_, "readback: a delivery callback is required");
  TORCH_CHECK(options_.probe.has_landed && options_.probe.wait,
              "readback: the landing probe needs has_landed and wait");
}

StepReadback::StepReadback(Deliver deliver) : StepReadback(std::move(deliver), Options{}) {}

StepReadback::~StepReadback() = default;

void StepReadback::check_keys(int64_t step, const StepScalars& scalars) {
  const auto& entries = scalars.entries();
  if (!keys_) {
    auto keys = std::make_shared<std::vector<std::string>>();
    keys->reserve(entries.size());
    counted_.clear();
    for (const auto& e : entries) {
      keys->push_back(e.key);
      counted_.push_back(e.finite_count.defined());
    }
    keys_ = std::move(keys);
    return;
  }
  const auto& keys = *keys_;
  for (size_t i = 0; i < std::max(keys.size(), entries.size()); ++i) {
    const std::string got = i < entries.size() ? entries[i].key : "<none>";
    const std::string want = i < keys.size() ? keys[i] : "<none>";
    TORCH_CHECK(got == want, options_.name, " readback: step ", step, " has key '", got,
                "' at position ", i, " where the first step had '", want,
                "'; every step must report the same keys in the same order");
    TORCH_CHECK(entries[i].finite_count.defined() == counted_[i], options_.name, " readback: step ",
                step, " key '", got,
                counted_[i] ? "' has no finite-target count, but the first step's had one"
                            : "' has a finite-target count, but the first step's had none");
  }
}

void StepReadback::start(int64_t step, const StepScalars& scalars, NamedValues host) {
  if (options_.policy == ReadbackPolicy::kNone) return;
  check_keys(step, scalars);
  at::Tensor reduced = reduce_step_scalars(scalars, options_.comm, step);

  PendingStep p;
  p.step = step;
  p.keys = keys_;
  p.counted = counted_;
  p.host = std::move(host);
  const auto device = reduced.device();
  if (device.is_cpu()) {
    p.host_buffer = reduced;  // the values are already on the host
  } else if (options_.policy == ReadbackPolicy::kBlocking) {
    p.host_buffer = reduced.cpu();
  } else {
    p.host_buffer =
        at::empty(reduced.sizes(), reduced.options().device(at::kCPU).pinned_memory(true));
    p.host_buffer.copy_(reduced, /*non_blocking=*/true);
    const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
    c10::Event event(device.type());
    event.record(impl->getStream(device));
    p.event.emplace(std::move(event));
  }
  if (options_.policy == ReadbackPolicy::kBlocking) {
    deliver_(finish(p));
    return;
  }
  pending_.push_back(std::move(p));
  while (options_.max_in_flight > 0 && pending_.size() > options_.max_in_flight) {
    options_.probe.wait(pending_.front());
    PendingStep oldest = std::move(pending_.front());
    pending_.pop_front();
    deliver_(finish(oldest));
  }
}

StepRecord StepReadback::finish(PendingStep& p) const {
  const auto& keys = *p.keys;
  const int64_t k = static_cast<int64_t>(keys.size());
  int64_t m = 0;
  for (bool c : p.counted) m += c ? 1 : 0;
  const at::Tensor buffer = p.host_buffer.contiguous();
  TORCH_INTERNAL_ASSERT(buffer.numel() == k + m);
  const double* data = buffer.data_ptr<double>();
  const int world = options_.comm != nullptr ? std::max(1, options_.comm->world_size()) : 1;
  // Readback order is [unmasked sums..., counted weighted sums..., counts...].
  StepRecord record;
  record.step = p.step;
  record.values.resize(keys.size());
  int64_t slot = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t i = 0; i < k; ++i) {
      if (p.counted[i] != (pass == 1)) continue;
      double value = data[slot];
      if (pass == 0) {
        // One rank: the value as the step produced it, untouched.
        if (world > 1) value /= world;
      } else {
        const double count = data[k + (slot - (k - m))];
        TORCH_CHECK(std::isfinite(count) && count >= 0, options_.name, " readback: step ", p.step,
                    " key '", keys[i], "' has finite-target count ", count,
                    " (summed over ranks); expected a finite count >= 0");
        value = count > 0 ? value / count : std::numeric_limits<double>::quiet_NaN();
      }
      record.values[i] = {keys[i], value};
      ++slot;
    }
  }
  record.host = std::move(p.host);
  return record;
}

size_t StepReadback::deliver_landed() {
  size_t delivered = 0;
  while (!pending_.empty() && options_.probe.has_landed(pending_.front())) {
    PendingStep p = std::move(pending_.front());
    pending_.pop_front();
    deliver_(finish(p));
    ++delivered;
  }
  return delivered;
}

size_t StepReadback::drain() {
  size_t delivered = 0;
  while (!pending_.empty()) {
    options_.probe.wait(pending_.front());
    PendingStep p = std::move(pending_.front());
    pending_.pop_front();
    deliver_(finish(p));
    ++delivered;
  }
  return delivered;
}

void StepReadback::discard() { pending_.clear(); }

ReadbackScope::ReadbackScope(StepReadback& readback)
    : readback_(readback), uncaught_at_entry_(std::uncaught_exceptions()) {}

ReadbackScope::~ReadbackScope() {
  if (std::uncaught_exceptions() <= uncaught_at_entry_) return;
  try {
    readback_.deliver_landed();
  } catch (const std::exception& e) {
    std::cerr << "readback: while unwinding, delivering landed steps failed: " << e.what() << '\n';
  }
  readback_.discard();
}

}  // namespace slipstream
