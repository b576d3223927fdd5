#include "aero/train/step_phases.h"

#include <array>
#include <string>

namespace slipstream::aero {

namespace {

const char* phase_scope_name(Phase p) {
  static const auto names = [] {
    std::array<std::string, kPhaseCount> n;
    for (int i = 0; i < kPhaseCount; ++i) n[i] = std::string("step.") + phase_name(Phase(i));
    return n;
  }();
  return names[static_cast<int>(p)].c_str();
}

}  // namespace

void StepPhases::enter(Phase p) {
  if (audit_.active()) audit_.set_phase(p);
  scope_.reset();
  scope_.emplace(at::RecordScope::USER_SCOPE);
  if (scope_->isActive()) scope_->before(phase_scope_name(p));
}

}  // namespace slipstream::aero
