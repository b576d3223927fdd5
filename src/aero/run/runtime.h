// The process a run or an inference runs in: its device and, when launched
// on several ranks, the process group, joined with the configured timeout
// (distributed.timeout_s) so that a rank that dies or hangs fails the
// others in bounded time. build_run and `slipstream infer` both open it
// here.
#pragma once

#include "core/distributed/communicator.h"
#include "core/distributed/launch_env.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>

namespace slipstream::aero {

struct Runtime {
  c10::Device device{c10::kCPU};
  std::unique_ptr<Communicator> comm;  // null for a world of one
  int rank = 0, world_size = 1;
};

// `device`: auto, cpu or cuda (a rank's GPU is its local rank's).
Runtime open_runtime(const std::string& device, const DistributedEnv& env, int64_t timeout_s);

}  // namespace slipstream::aero
