// Runs a test body on N ranks: rank 0 in this process, ranks 1.. as copies of
// this test binary started with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set
// and a gtest filter that selects the same test. A worker's failed
// assertions make its exit code non-zero, which fails the test in rank 0.
#pragma once

#include <functional>
#include <string>

namespace slipstream::testing {

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port();

// True inside a worker started by run_ranks (then RANK etc. are set).
bool is_worker();

// In rank 0: starts the workers, runs `body` as rank 0, and returns after
// every worker has exited; fails the test if any exits non-zero. In a
// worker: runs `body` only.
void run_ranks(int world_size, const std::function<void()>& body,
               const std::string& extra_env = "");

}  // namespace slipstream::testing
