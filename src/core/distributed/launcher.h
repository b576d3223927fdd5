// launch_local_ranks: starts `nproc` copies of a program on this machine as
// one process group (what `torchrun --standalone --nproc-per-node N` does):
// each child gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1 and
// MASTER_PORT.
//
// - The children die with the launcher (PR_SET_PDEATHSIG): a kill -9 of the
//   launcher leaves no orphaned rank.
// - SIGTERM / SIGINT to the launcher are forwarded to every rank (which
//   checkpoint and exit 143 / 130); a second one kills them.
// - If a rank fails, the others are stopped (SIGTERM, then SIGKILL after a
//   grace period) and its exit code is returned. The launcher names the rank
//   that caused it: each failing rank leaves a report (the ranks it blames:
//   those that died, were stopped or hung) in SLIPSTREAM_LAUNCH_REPORTS, so a
//   healthy rank that timed out waiting is not blamed for a hung one.
// Returns 0 when every rank succeeds.
#pragma once

#include <string>
#include <vector>

namespace slipstream {

int launch_local_ranks(int nproc, int master_port, const std::string& program,
                       const std::vector<std::string>& args);

}  // namespace slipstream
