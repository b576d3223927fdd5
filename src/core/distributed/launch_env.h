// Which launcher started this process, and the rank layout it gives.
//
// Read in this order; the first launcher whose variables are present wins:
//   1. torchrun or `slipstream launch`: RANK, WORLD_SIZE, LOCAL_RANK,
//      MASTER_ADDR, MASTER_PORT (and GROUP_RANK, GROUP_WORLD_SIZE,
//      LOCAL_WORLD_SIZE for the node layout, when set).
//   2. SLURM (`srun`): SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS,
//      else SLURM_NPROCS), SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_NUM_NODES
//      (else SLURM_NNODES). The rendezvous host is MASTER_ADDR if set, else
//      the first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST (expanded
//      from SLURM's compressed form, e.g. gpu[01-04,07]), else
//      SLURM_LAUNCH_NODE_IPADDR. The port is MASTER_PORT if set, else
//      slurm_default_port(SLURM_JOB_ID), the same on every task of a job.
//      A batch script that runs the program without `srun` (SLURM_NTASKS > 1
//      but no SLURM_STEP_NUM_TASKS) is refused, saying to use srun.
//   3. OpenMPI (`mpirun`): OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//      OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE; the rendezvous
//      is MASTER_ADDR (required for more than one rank: mpirun gives no
//      address) and MASTER_PORT (default 29500).
//   4. None of these: one process.
// Malformed or inconsistent variables throw c10::Error naming the variable.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace slipstream {

struct DistributedEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;
  int master_port = 0;

  // What was detected: "none", "torchrun", "slipstream launch", "environment"
  // (RANK/WORLD_SIZE set by hand or another tool), "slurm" or "openmpi".
  std::string launcher = "none";
  int node_rank = 0;         // -1 where the launcher does not say
  int num_nodes = 1;         // -1 where the launcher does not say
  int local_world_size = 1;  // ranks on this node; -1 where not said
  std::string master_from;   // where master_addr came from, e.g. "SLURM_JOB_NODELIST"

  // Reads this process's environment.
  static DistributedEnv from_environment();
  // Reads variables through `get` (null for unset); for tests and tools.
  static DistributedEnv from_variables(const std::function<const char*(const char*)>& get);

  // "slurm: rank 3 of 8 (node 1 of 2, local rank 1 of 4), rendezvous at
  // gpu01:21234 (first host of SLURM_JOB_NODELIST)"; "one process" for none.
  std::string describe() const;
};

// Every host of a SLURM node list such as "gpu[01-04,07],login1" (zero
// padding kept, several bracket groups multiplied out). Throws c10::Error
// on a malformed list or one of more than `limit` hosts.
std::vector<std::string> expand_slurm_nodelist(const std::string& list, size_t limit = 65536);

// The rendezvous port a SLURM job uses when MASTER_PORT is unset:
// 20000 + job_id % 10000 (below Linux's ephemeral ports, so that two jobs
// sharing a node rarely collide, and the same on every task of one job).
int slurm_default_port(long long job_id);

}  // namespace slipstream
