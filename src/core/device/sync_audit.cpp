#include "core/device/sync_audit.h"

#include "core/device/device.h"

#include <torch/version.h>

#include <sstream>

namespace slipstream {

const char* phase_name(Phase p) {
  static const char* names[] = {"loader",    "forward",  "loss",    "backward",
                                "optimizer", "readback", "logging", "other"};
  return names[static_cast<int>(p)];
}

// c10's warning-handler API changed between LibTorch 1.x and 2.x.
class SyncAudit::Handler : public c10::WarningHandler {
 public:
  explicit Handler(SyncAudit* owner) : owner_(owner) {}
#if TORCH_VERSION_MAJOR >= 2
  void process(const c10::Warning& warning) override {
    if (!owner_->on_warning(warning.msg()) && previous != nullptr) previous->process(warning);
  }
#else
  void process(const c10::SourceLocation& loc, const std::string& msg, bool verbatim) override {
    if (!owner_->on_warning(msg) && previous != nullptr) previous->process(loc, msg, verbatim);
  }
#endif
  c10::WarningHandler* previous = nullptr;

 private:
  SyncAudit* owner_;
};

namespace {
#if TORCH_VERSION_MAJOR >= 2
c10::WarningHandler* get_handler() { return c10::WarningUtils::get_warning_handler(); }
void set_handler(c10::WarningHandler* h) { c10::WarningUtils::set_warning_handler(h); }
#else
c10::WarningHandler* get_handler() { return c10::Warning::get_warning_handler(); }
void set_handler(c10::WarningHandler* h) { c10::Warning::set_warning_handler(h); }
#endif
}  // namespace

SyncAudit::SyncAudit() : handler_(std::make_unique<Handler>(this)) {}

SyncAudit::~SyncAudit() { stop(); }

bool SyncAudit::start() {
  if (active_) return true;
  previous_mode_ = get_sync_debug_mode();
  if (!set_sync_debug_mode(1)) return false;
  previous_ = get_handler();
  handler_->previous = previous_;
  set_handler(handler_.get());
  active_ = true;
  return true;
}

void SyncAudit::stop() {
  if (!active_) return;
  set_sync_debug_mode(previous_mode_);
  set_handler(previous_);
  active_ = false;
}

bool SyncAudit::on_warning(const std::string& message) {
  if (message.find("synchroniz") == std::string::npos) {
    ++other_warnings_;
    return false;
  }
  if (counting_) ++counts_[static_cast<int>(phase_)];
  return true;
}

int64_t SyncAudit::total() const {
  int64_t n = 0;
  for (auto c : counts_) n += c;
  return n;
}

double SyncAudit::per_step() const {
  return steady_steps_ > 0 ? static_cast<double>(total()) / static_cast<double>(steady_steps_)
                           : 0.0;
}

std::string SyncAudit::report() const {
  std::ostringstream out;
  out << "Sync audit: " << total() << " synchronizing CUDA calls in " << steady_steps_
      << " steady-state steps (" << per_step() << " per step)";
  if (total() > 0) {
    out << "; by phase:";
    for (int i = 0; i < kPhaseCount; ++i) {
      if (counts_[i] > 0) out << " " << phase_name(static_cast<Phase>(i)) << "=" << counts_[i];
    }
  }
  out << "\n";
  return out.str();
}

}  // namespace slipstream
