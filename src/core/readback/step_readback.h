// StepReadback: read every step's losses and metrics back to the host without
// making the host wait for the device.
//
// Contract (docs/design.md, "The readback contract"). For each step, `start()`:
//   1. packs the step's 0-d tensors into one flat fp64 buffer on their device;
//   2. when a communicator with world size > 1 is given, runs ONE all-reduce
//      (SUM) of [value ..., value*count ..., count ...], so that each delivered
//      value is the (count-weighted) mean over all ranks, NaN where every
//      count is 0;
//   3. on CUDA, copies the result non_blocking into pinned host memory and
//      records an event on the current stream.
// Nothing in `start()` or `deliver_landed()` blocks the host: no .item(),
// no .cpu(), no synchronize.
//
// `deliver_landed()` (call after each step) hands the caller, in step order,
// every pending step whose copy has landed, and stops at the first that has
// not. `drain()` (the epoch's end) waits for the rest and delivers them.
// Each step is delivered exactly once. Host fields given to `start()` (the
// step's learning rate, its wall time) travel with the step unchanged.
//
// Blocking equivalent: each delivered record equals `reduce_step_scalars()`
// of the same tensors followed at once by `.cpu()`, bitwise; it is delivered
// later. On one rank without counts, a delivered value is the step's own
// value converted to double, untouched by any arithmetic.
//
// Errors: a value that is not 0-d, a step whose keys differ from the first
// step's, or (checked on delivery) a count that is negative or not finite
// throws c10::Error naming the key and the step.
//
// ReadbackScope: an RAII guard for an epoch. If the scope exits by an
// exception, its destructor delivers the steps that have landed, without
// waiting, and drops the rest; the exception propagates.
#pragma once

#include "core/readback/step_scalars.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace slipstream {

class Communicator;

using NamedValues = std::vector<std::pair<std::string, double>>;

// How a step's values come back to the host.
enum class ReadbackPolicy {
  kAsync,     // non-blocking copy, delivered once landed (the default)
  kBlocking,  // reduction then .cpu() at once: a loop that waits for the GPU
  kNone,      // nothing is read back or delivered (benchmarks only)
};
ReadbackPolicy parse_readback_policy(const std::string& name);
std::string to_string(ReadbackPolicy policy);

// One step, delivered to the host.
struct StepRecord {
  int64_t step = 0;
  // Device values in the order the step added them (keys as in StepScalars).
  NamedValues values;
  // Host fields captured at start(): e.g. lr, step_time_s.
  NamedValues host;
};

// A step whose copy may still be in flight.
struct PendingStep {
  int64_t step = 0;
  std::shared_ptr<const std::vector<std::string>> keys;
  std::vector<bool> counted;        // per key: was a finite-target count given?
  at::Tensor host_buffer;           // reduce_step_scalars() of the step, on the host
  std::optional<c10::Event> event;  // recorded after the copy, CUDA only
  NamedValues host;
};

// "Has this step's copy landed?" and "wait until it has". Injectable so that
// tests can hold steps and release them; the default queries the event.
struct LandingProbe {
  std::function<bool(const PendingStep&)> has_landed;
  std::function<void(const PendingStep&)> wait;
};
LandingProbe event_landing_probe();

// The reduction both policies share: returns a 1-d fp64 tensor on the
// values' device in readback order: [unmasked values..., value*count of
// counted keys..., counts of counted keys...], each group in the order the
// step added them, summed over ranks when distributed. The division into
// means happens on the host at delivery (the same code for both policies),
// which saves kernels on the device.
at::Tensor reduce_step_scalars(const StepScalars& scalars, Communicator* comm, int64_t step);

class StepReadback {
 public:
  using Deliver = std::function<void(const StepRecord&)>;

  struct Options {
    ReadbackPolicy policy = ReadbackPolicy::kAsync;
    Communicator* comm = nullptr;  // null or world size 1: no all-reduce
    LandingProbe probe = event_landing_probe();
    std::string name = "train";  // names the phase in error messages
    // > 0: a bound on how far delivery may lag. When start() leaves more
    // than this many steps pending, it waits for the oldest and delivers
    // it, so that after start(j) every step <= j - max_in_flight has been
    // delivered, on every rank alike. The host then waits only when it runs
    // that many steps ahead of the device (never, in a steady loop with a
    // small bound like 4). 0: no bound.
    size_t max_in_flight = 0;
  };

  StepReadback(Deliver deliver, Options options);
  explicit StepReadback(Deliver deliver);
  ~StepReadback();
  StepReadback(const StepReadback&) = delete;
  StepReadback& operator=(const StepReadback&) = delete;

  // Starts reading back `step`. Never blocks under kAsync (but see
  // max_in_flight); under kBlocking it delivers the step before returning.
  void start(int64_t step, const StepScalars& scalars, NamedValues host = {});
  // Delivers, in order, every pending step that has landed; stops at the
  // first that has not. Returns how many were delivered. Never blocks.
  size_t deliver_landed();
  // Waits for every pending step and delivers it. The epoch's end.
  size_t drain();
  // Drops the pending steps without delivering them.
  void discard();

  size_t pending() const { return pending_.size(); }
  ReadbackPolicy policy() const { return options_.policy; }

 private:
  StepRecord finish(PendingStep& pending) const;
  void check_keys(int64_t step, const StepScalars& scalars);

  Deliver deliver_;
  Options options_;
  std::shared_ptr<const std::vector<std::string>> keys_;
  std::vector<bool> counted_;
  std::deque<PendingStep> pending_;
};

// Delivers the landed steps, without waiting, if the scope exits by an
// exception; destructors never throw, so a failing delivery is logged.
class ReadbackScope {
 public:
  explicit ReadbackScope(StepReadback& readback);
  ~ReadbackScope();
  ReadbackScope(const ReadbackScope&) = delete;
  ReadbackScope& operator=(const ReadbackScope&) = delete;

 private:
  StepReadback& readback_;
  int uncaught_at_entry_;
};

}  // namespace slipstream
