// What a train or val epoch yields, and the pieces both kinds of epoch
// share: the readback's options, the epoch summary (logged on rank 0, the
// peak memory the largest over ranks), the points a batch trains on.
#pragma once

#include "aero/data/loader.h"
#include "aero/train/run.h"
#include "core/readback/step_readback.h"
#include "core/sinks/metrics_logger.h"

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace slipstream::aero {

struct EpochResult {
  int64_t epoch = 0;
  int64_t steps = 0;         // steps of the epoch taken (a resumed part included)
  bool interrupted = false;  // a stop request ended it before its last step
  double seconds = 0.0;
  double data_seconds = 0.0;  // the host's wait for batches
  double peak_memory_gib = 0.0;
  int64_t graph_captures = 0;           // CUDA graphs captured (training.cuda_graph)
  std::map<std::string, double> means;  // per key, NaN steps left out
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0);

// The run's readback policy and communicator, named `phase`.
StepReadback::Options readback_options(const Run& run, const char* phase);

// The epoch's result; on rank 0 its summary record is written to `logger`.
// With several ranks the peak memory is the largest over them (a
// collective: every rank calls it).
EpochResult finish_epoch(Run& run, MetricsLogger& logger, const char* phase, int64_t epoch,
                         int64_t steps, double seconds, double data_seconds,
                         const std::map<std::string, double>& means);

// The points a step trains on over all ranks: (1, N, C) targets of N points
// each (a domain-parallel rank's N is its shard); NaN without a target.
double batch_points(const Batch& batch, int world_size);

}  // namespace slipstream::aero
