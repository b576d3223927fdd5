// Process-group setup for a DistributedEnv (launch_env.h: torchrun, SLURM,
// OpenMPI or `slipstream launch`), which names this process and the
// rendezvous; rank 0 hosts a c10d TCPStore there and every rank
// joins it (under torchrun, which sets TORCHELASTIC_USE_AGENT_STORE=True, the
// agent hosts it and rank 0 joins too). The backend is Gloo for CPU tensors and NCCL for CUDA
// tensors, whichever this build has (Debian's LibTorch has Gloo; the GPU image's has NCCL). A world
// of one needs no environment and returns no communicator.
#pragma once

#include "core/distributed/communicator.h"
#include "core/distributed/launch_env.h"

#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>

namespace slipstream {

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
