// training.memory_check: before the first step of a session, a step of the
// first batch's size is estimated (model/memory_estimate.h) and refused
// when it would not fit the device, naming the keys that make it smaller.
#pragma once

#include "aero/data/loader.h"
#include "aero/train/run.h"

namespace slipstream::aero {

// Throws (naming the rank, the sample and the keys) when a step of
// `batch`'s size needs more memory than run's device has; rank 0 prints
// the estimate. Nothing where training.memory_check is off or no estimate
// exists.
void check_step_memory(const Run& run, const Batch& batch);

}  // namespace slipstream::aero
