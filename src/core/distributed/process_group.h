// Process-group setup from torchrun-style environment variables.
//
// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT name this process
// and the rendezvous; rank 0 hosts a c10d TCPStore there and every rank
// joins it (under torchrun, which sets TORCHELASTIC_USE_AGENT_STORE=True, the
// agent hosts it and rank 0 joins too). The backend is Gloo for CPU tensors and NCCL for CUDA
// tensors, whichever this build has (Debian's LibTorch has Gloo; the GPU image's has NCCL). A world
// of one needs no environment and returns no communicator.
#pragma once

#include "core/distributed/communicator.h"

#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>

namespace slipstream {

struct DistributedEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;
  int master_port = 0;

  // Reads the variables; a missing WORLD_SIZE means a world of one. Throws
  // c10::Error naming the variable that is missing or malformed.
  static DistributedEnv from_environment();
};

struct ProcessGroupOptions {
  // A rank that dies or hangs makes the others fail after this long.
  std::chrono::milliseconds timeout{std::chrono::minutes(3)};
};

// Joins the process group; returns null for a world of one.
std::unique_ptr<Communicator> init_process_group(const DistributedEnv& env, c10::Device device,
                                                 const ProcessGroupOptions& options = {});

// Which backends this build can create.
bool has_gloo_backend();
bool has_nccl_backend();

}  // namespace slipstream
