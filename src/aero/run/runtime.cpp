#include "aero/run/runtime.h"

#include "core/device/device.h"
#include "core/distributed/process_group.h"

#include <chrono>

namespace slipstream::aero {

Runtime open_runtime(const std::string& device, const DistributedEnv& env, int64_t timeout_s) {
  Runtime rt;
  rt.device = resolve_device(device, env.local_rank);
  ProcessGroupOptions pg;
  pg.timeout = std::chrono::seconds(timeout_s);
  rt.comm = init_process_group(env, rt.device, pg);
  if (rt.comm) {
    rt.rank = rt.comm->rank();
    rt.world_size = rt.comm->world_size();
  }
  return rt;
}

}  // namespace slipstream::aero
