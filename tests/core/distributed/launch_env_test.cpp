// Launcher detection: torchrun's, SLURM's and OpenMPI's variables give the
// rank layout and the rendezvous each launcher documents, in that order of
// precedence, and the launches that cannot work (a SLURM job script without
// srun, mpirun without an address) fail saying what to run instead.
#include "core/distributed/launch_env.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace slipstream {
namespace {

using Vars = std::map<std::string, std::string>;

DistributedEnv detect(const Vars& vars) {
  return DistributedEnv::from_variables([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const Vars& vars) {
  try {
    detect(vars);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

// What `srun` sets for task 5 of 8 on two nodes of four tasks each.
Vars srun_task5() {
  return {{"SLURM_JOB_ID", "123456"},
          {"SLURM_PROCID", "5"},
          {"SLURM_NTASKS", "8"},
          {"SLURM_STEP_NUM_TASKS", "8"},
          {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "1"},
          {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
          {"SLURM_JOB_NODELIST", "gpu[07-08]"},
          {"SLURM_LAUNCH_NODE_IPADDR", "10.0.0.7"}};
}

TEST(LaunchEnvTest, NoLauncherIsOneProcess) {
  const auto env = detect({{"HOME", "/root"}});
  EXPECT_EQ(env.launcher, "none");
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.describe(), "one process (no launcher variables)");
}

TEST(LaunchEnvTest, TorchrunGivesItsLayout) {
  const auto env = detect({{"RANK", "6"},
                           {"WORLD_SIZE", "8"},
                           {"LOCAL_RANK", "2"},
                           {"LOCAL_WORLD_SIZE", "4"},
                           {"GROUP_RANK", "1"},
                           {"GROUP_WORLD_SIZE", "2"},
                           {"MASTER_ADDR", "node0"},
                           {"MASTER_PORT", "29400"},
                           {"TORCHELASTIC_RUN_ID", "none"}});
  EXPECT_EQ(env.launcher, "torchrun");
  EXPECT_EQ(env.rank, 6);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.node_rank, 1);
  EXPECT_EQ(env.num_nodes, 2);
  EXPECT_EQ(env.master_addr, "node0");
  EXPECT_EQ(env.master_port, 29400);
  EXPECT_EQ(env.describe(),
            "torchrun: rank 6 of 8 (node 1 of 2, local rank 2 of 4), rendezvous at "
            "node0:29400 (MASTER_ADDR)");
}

TEST(LaunchEnvTest, SlipstreamLaunchIsNamed) {
  const auto env = detect({{"RANK", "1"},
                           {"WORLD_SIZE", "2"},
                           {"MASTER_ADDR", "127.0.0.1"},
                           {"MASTER_PORT", "29500"},
                           {"SLIPSTREAM_LAUNCH_REPORTS", "/tmp/x"}});
  EXPECT_EQ(env.launcher, "slipstream launch");
  EXPECT_EQ(env.local_rank, 1);  // LOCAL_RANK defaults to RANK
}

TEST(LaunchEnvTest, TorchrunVariablesMissingOrBadAreNamed) {
  EXPECT_NE(error_of({{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}})
                .find("RANK is required"),
            std::string::npos);
  EXPECT_NE(error_of({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_PORT", "1"}})
                .find("MASTER_ADDR is required"),
            std::string::npos);
  EXPECT_NE(
      error_of({{"WORLD_SIZE", "2"}, {"RANK", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}})
          .find("RANK=2 is not below WORLD_SIZE=2"),
      std::string::npos);
  EXPECT_NE(error_of({{"WORLD_SIZE", "two"}}).find("WORLD_SIZE='two'"), std::string::npos);
  EXPECT_NE(
      error_of({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "70000"}})
          .find("MASTER_PORT=70000 is not a valid port"),
      std::string::npos);
}

TEST(LaunchEnvTest, SrunGivesTheLayoutAndTheFirstHostOfTheNodeList) {
  const auto env = detect(srun_task5());
  EXPECT_EQ(env.launcher, "slurm");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.node_rank, 1);
  EXPECT_EQ(env.num_nodes, 2);
  EXPECT_EQ(env.master_addr, "gpu07");
  EXPECT_EQ(env.master_from, "first host of SLURM_JOB_NODELIST");
  EXPECT_EQ(env.master_port, slurm_default_port(123456));
  EXPECT_EQ(env.master_port, 23456);
}

TEST(LaunchEnvTest, SrunRendezvousPrefersMasterAddrThenNodeListThenLaunchNode) {
  auto vars = srun_task5();
  vars["MASTER_ADDR"] = "ib-gpu07";
  vars["MASTER_PORT"] = "31000";
  auto env = detect(vars);
  EXPECT_EQ(env.master_addr, "ib-gpu07");
  EXPECT_EQ(env.master_port, 31000);
  vars = srun_task5();
  vars["SLURM_STEP_NODELIST"] = "gpu[02,05]";  // the step's nodes, a subset of the job's
  EXPECT_EQ(detect(vars).master_addr, "gpu02");
  vars = srun_task5();
  vars.erase("SLURM_JOB_NODELIST");
  env = detect(vars);
  EXPECT_EQ(env.master_addr, "10.0.0.7");
  EXPECT_EQ(env.master_from, "SLURM_LAUNCH_NODE_IPADDR");
  vars.erase("SLURM_LAUNCH_NODE_IPADDR");
  EXPECT_NE(error_of(vars).find("set MASTER_ADDR"), std::string::npos);
}

TEST(LaunchEnvTest, TorchrunInsideASlurmJobWins) {
  auto vars = srun_task5();
  vars["RANK"] = "0";
  vars["WORLD_SIZE"] = "4";
  vars["MASTER_ADDR"] = "localhost";
  vars["MASTER_PORT"] = "29500";
  const auto env = detect(vars);
  EXPECT_EQ(env.launcher, "environment");
  EXPECT_EQ(env.world_size, 4);
}

TEST(LaunchEnvTest, AJobScriptWithoutSrunFailsSayingToUseSrun) {
  // sbatch --ntasks=4 with `slipstream train` in the script: one process,
  // SLURM_PROCID 0, no step variables.
  const Vars vars{
      {"SLURM_JOB_ID", "77"}, {"SLURM_PROCID", "0"},         {"SLURM_NTASKS", "4"},
      {"SLURM_NPROCS", "4"},  {"SLURM_LOCALID", "0"},        {"SLURM_NODEID", "0"},
      {"SLURM_NNODES", "1"},  {"SLURM_TASKS_PER_NODE", "4"}, {"SLURM_JOB_NODELIST", "gpu01"}};
  const auto msg = error_of(vars);
  EXPECT_NE(msg.find("SLURM_NTASKS=4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not started by srun"), std::string::npos) << msg;
  EXPECT_NE(msg.find("srun slipstream train"), std::string::npos) << msg;
  EXPECT_NE(msg.find("slipstream launch --nproc"), std::string::npos) << msg;
  // The same script with one task is a plain single-process run.
  auto one = vars;
  one["SLURM_NTASKS"] = one["SLURM_NPROCS"] = one["SLURM_TASKS_PER_NODE"] = "1";
  const auto env = detect(one);
  EXPECT_EQ(env.launcher, "slurm");
  EXPECT_EQ(env.world_size, 1);
  EXPECT_TRUE(env.master_addr.empty());
}

TEST(LaunchEnvTest, InconsistentSlurmVariablesAreNamed) {
  auto vars = srun_task5();
  vars["SLURM_PROCID"] = "8";
  EXPECT_NE(error_of(vars).find("SLURM_PROCID=8 is not below SLURM_STEP_NUM_TASKS=8"),
            std::string::npos);
  vars = srun_task5();
  vars["SLURM_LOCALID"] = "4";
  EXPECT_NE(error_of(vars).find("local rank 4 is not below the 4 ranks on this node"),
            std::string::npos);
  vars = srun_task5();
  vars["SLURM_NODEID"] = "2";
  EXPECT_NE(error_of(vars).find("node rank 2 is not below the 2 nodes"), std::string::npos);
}

TEST(LaunchEnvTest, OpenMpiGivesItsLayoutAndNeedsAnAddress) {
  Vars vars{{"OMPI_COMM_WORLD_RANK", "3"},
            {"OMPI_COMM_WORLD_SIZE", "4"},
            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  const auto msg = error_of(vars);
  EXPECT_NE(msg.find("mpirun -x MASTER_ADDR="), std::string::npos) << msg;
  vars["MASTER_ADDR"] = "host0";
  const auto env = detect(vars);
  EXPECT_EQ(env.launcher, "openmpi");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.num_nodes, 2);
  EXPECT_EQ(env.master_addr, "host0");
  EXPECT_EQ(env.master_port, 29500);
}

TEST(LaunchEnvTest, SlurmNodeListsExpand) {
  EXPECT_EQ(expand_slurm_nodelist("gpu[01-04,07]"),
            (std::vector<std::string>{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07"}));
  EXPECT_EQ(expand_slurm_nodelist("login1"), (std::vector<std::string>{"login1"}));
  EXPECT_EQ(
      expand_slurm_nodelist("r[1-2]-n[08-09],cpu[9-10].ib"),
      (std::vector<std::string>{"r1-n08", "r1-n09", "r2-n08", "r2-n09", "cpu9.ib", "cpu10.ib"}));
  EXPECT_EQ(expand_slurm_nodelist("n[098-101]"),
            (std::vector<std::string>{"n098", "n099", "n100", "n101"}));
  for (const char* bad : {"gpu[01-", "gpu[3-1]", "a,,b", "gpu[]", "gpu[a-b]", "gpu]", ""}) {
    EXPECT_THROW(expand_slurm_nodelist(bad), c10::Error) << bad;
  }
  EXPECT_THROW(expand_slurm_nodelist("n[1-100]", 50), c10::Error);
}

}  // namespace
}  // namespace slipstream
