// launch_local_ranks: starts `nproc` copies of a program on this machine as
// one process group (what `torchrun --standalone --nproc-per-node N` does):
// each child gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1 and
// MASTER_PORT. If a child fails, the others are stopped (SIGTERM, then
// SIGKILL after a grace period) and its exit code is returned; 0 when all
// succeed.
#pragma once

#include <string>
#include <vector>

namespace slipstream {

int launch_local_ranks(int nproc, int master_port, const std::string& program,
                       const std::vector<std::string>& args);

}  // namespace slipstream
