// StepGuard: what a train step tells every rank besides its losses — that
// this rank's own loss is not finite (a bit per rank), that the averaged
// gradients are not (one flag: averaged, they cannot say whose), or that
// this rank was asked to stop (SIGTERM, SIGINT) — as three more scalars in
// the step's one readback all-reduce, so that it costs no collective and no
// host sync. A non-finite loss names the ranks whose loss it was. Their
// keys start with "control/"; observe() takes them out of the values that
// are logged.
//
// Every rank delivers the same values for a step, but not at the same loop
// iteration. So a flag delivered for step k takes effect after step
// k + lag, where lag is the readback's max_in_flight bound: by the end of
// that step every rank has delivered step k, and all of them stop after the
// same step, with the same collectives behind them.
#pragma once

#include "core/process/exit_error.h"
#include "core/readback/step_readback.h"
#include "core/readback/step_scalars.h"

#include <torch/types.h>

#include <optional>
#include <string>
#include <vector>

namespace slipstream::aero {

// A non-finite loss or gradient: exit code kExitNonFinite.
class NonFiniteError : public ExitError {
 public:
  explicit NonFiniteError(const std::string& message) : ExitError(kExitNonFinite, message) {}
};

class StepGuard {
 public:
  StepGuard(int rank, int world_size, int64_t lag);

  // Adds this step's control scalars (device tensors; nothing is read
  // back): this rank's bit where `loss` is NaN or Inf, the gradients' flag
  // where any gradient is.
  void add_controls(StepScalars& scalars, const torch::Tensor& loss,
                    const std::vector<torch::Tensor>& gradients, bool stop_requested) const;
  // Reads a delivered step's controls and removes them from its values.
  void observe(StepRecord& record);

  // Whether the loop must stop after step `step` (a global step index).
  bool stop_after(int64_t step) const { return stop_at_.has_value() && step >= *stop_at_; }
  // The step whose values first carried a flag, if any.
  std::optional<int64_t> flagged_step() const { return flagged_step_; }
  bool stop_requested() const { return stop_requested_; }
  // Throws NonFiniteError (naming the step, the ranks and the fields) if a
  // step was non-finite.
  void throw_if_nonfinite() const;

 private:
  int rank_, world_;
  int64_t lag_;
  std::optional<int64_t> stop_at_, flagged_step_;
  bool stop_requested_ = false;
  std::string nonfinite_;  // the report, empty if none
};

}  // namespace slipstream::aero
