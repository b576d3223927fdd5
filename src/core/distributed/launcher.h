// launch_local_ranks: starts `nproc` copies of a program on this machine as
// node `node_rank` of `nnodes` of one process group, what torchrun's static
// rendezvous does (`torchrun --nnodes N --node-rank R --master-addr HOST
// --master-port P --nproc-per-node K`): each child gets RANK = R*K + i,
// LOCAL_RANK = i, WORLD_SIZE = N*K, GROUP_RANK = R, GROUP_WORLD_SIZE = N,
// LOCAL_WORLD_SIZE = K, MASTER_ADDR and MASTER_PORT. Every node runs the
// same command with its own node rank; rank 0 (on node 0) hosts the
// rendezvous at MASTER_ADDR:MASTER_PORT.
//
// - The children die with the launcher (PR_SET_PDEATHSIG): a kill -9 of the
//   launcher leaves no orphaned rank.
// - SIGTERM / SIGINT to the launcher are forwarded to every rank (which
//   checkpoint and exit 143 / 130); a second one kills them.
// - If a rank fails, the others on this node are stopped (SIGTERM, then SIGKILL after a
//   grace period) and its exit code is returned. The launcher names the rank
//   that caused it: each failing rank leaves a report (the ranks it blames:
//   those that died, were stopped or hung) in SLIPSTREAM_LAUNCH_REPORTS, so a
//   healthy rank that timed out waiting is not blamed for a hung one.
// Returns 0 when every rank succeeds.
#pragma once

#include <string>
#include <vector>

namespace slipstream {

struct LaunchOptions {
  int nproc = 1;   // ranks on this node
  int nnodes = 1;  // nodes in the group
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";  // the host of node 0
  int master_port = 29500;
};

// Throws c10::Error on options that cannot form a group, naming the option.
int launch_local_ranks(const LaunchOptions& options, const std::string& program,
                       const std::vector<std::string>& args);

}  // namespace slipstream
