// A train step's phases (core/device/sync_audit.h's Phase): each one is
// told to the sync audit where it is active and opened as a profiler scope
// ("step.loader", "step.forward", ...), so that a trace (bench --profile)
// says where the host's time in a step goes.
#pragma once

#include "core/device/sync_audit.h"

#include <ATen/record_function.h>

#include <optional>

namespace slipstream::aero {

class StepPhases {
 public:
  explicit StepPhases(SyncAudit& audit) : audit_(audit) {}
  // Closes the open phase's scope and opens p's.
  void enter(Phase p);
  // Closes the open phase's scope.
  void end() { scope_.reset(); }

 private:
  SyncAudit& audit_;
  std::optional<at::RecordFunction> scope_;
};

}  // namespace slipstream::aero
