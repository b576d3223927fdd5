// A validation pass: the run's val split, the same points every epoch (so
// that val losses compare across epochs), no gradients.
#pragma once

#include "aero/train/epoch_result.h"
#include "aero/train/run.h"
#include "core/sinks/metrics_logger.h"

#include <cstdint>

namespace slipstream::aero {

// Every val step's losses and metrics as `val` records (rank 0) numbered
// from val_step on, which it advances; the epoch's summary. A step whose
// loss is not finite is left out of the means and named with its sample on
// stderr, never silently.
EpochResult validate_epoch(Run& run, MetricsLogger& logger, int64_t epoch, int64_t& val_step);

}  // namespace slipstream::aero
