// SyncAudit: counts the synchronizing CUDA calls the training thread makes,
// by phase. While enabled it turns CUDA's sync debugging to "warn" and
// catches those warnings on this thread (c10's warning handler is
// per-thread), attributing each to the phase set last. Only steps marked
// steady are counted per step. Where CUDA is not built in, it says so and
// counts nothing.
#pragma once

#include <c10/util/Exception.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

namespace slipstream {

enum class Phase { kLoader, kForward, kLoss, kBackward, kOptimizer, kReadback, kLogging, kOther };
constexpr int kPhaseCount = 8;
const char* phase_name(Phase p);

class SyncAudit {
 public:
  SyncAudit();
  ~SyncAudit();
  // Starts counting on the calling thread; returns false without CUDA.
  bool start();
  void stop();
  bool active() const { return active_; }
  void set_phase(Phase p) { phase_ = p; }
  void begin_steady_step() {
    ++steady_steps_;
    counting_ = true;
  }
  void end_steady_step() { counting_ = false; }

  int64_t total() const;
  int64_t count(Phase p) const { return counts_[static_cast<int>(p)]; }
  int64_t steady_steps() const { return steady_steps_; }
  double per_step() const;
  std::string report() const;

  // Called by the handler; true when the warning was a sync and is consumed.
  bool on_warning(const std::string& message);

 private:
  class Handler;
  std::unique_ptr<Handler> handler_;
  c10::WarningHandler* previous_ = nullptr;
  int previous_mode_ = 0;
  bool active_ = false;
  bool counting_ = false;
  Phase phase_ = Phase::kOther;
  std::array<int64_t, kPhaseCount> counts_{};
  int64_t steady_steps_ = 0;
  int64_t other_warnings_ = 0;
};

}  // namespace slipstream
