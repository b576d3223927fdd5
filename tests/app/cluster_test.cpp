// The slipstream executable started as a cluster starts it, on this machine:
// two `launch --nnodes 2` processes as two nodes of one group, `srun`'s
// variables exported per task, and a SLURM job script that forgot srun.
// Each run is one run directory whose log has every step once, in order,
// and whose config record names the launcher and the rank layout.
#include "core/distributed/process_group.h"
#include "support/multiprocess.h"
#include "support/process.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

namespace slipstream {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::Exit;
using testing::Process;

// 8 train samples, 2 epochs, no run_id: rank 0's timestamp names the run.
std::vector<std::string> train_args(const std::string& out) {
  return {"train",
          "model.n_layers=1",
          "model.n_hidden=32",
          "model.n_head=2",
          "model.slice_num=8",
          "dataset.num_train=8",
          "dataset.num_val=4",
          "dataset.points_per_sample=500",
          "dataset.sampling_resolution=200",
          "training.num_epochs=2",
          "output_dir=" + out,
          "logging.console_every_n_steps=1000",
          "device=cpu"};
}

std::vector<nlohmann::json> records(const std::string& path, const std::string& phase) {
  std::vector<nlohmann::json> out;
  for (const auto& line : testing::read_lines(path)) {
    auto j = nlohmann::json::parse(line);
    if (j.value("phase", "") == phase) out.push_back(j);
  }
  return out;
}

// The one run directory under `out`, after checking there is exactly one.
std::string the_run(const std::string& out) {
  std::vector<std::string> runs;
  for (const auto& e : fs::directory_iterator(out)) runs.push_back(e.path().string());
  EXPECT_EQ(runs.size(), 1u) << "run directories under " << out;
  return runs.empty() ? "" : runs.front();
}

// Every train step once, in order; `steps` of them.
void expect_every_step_once(const std::string& run, int steps) {
  const auto logged = records(run + "/metrics.jsonl", "train_step");
  ASSERT_EQ(logged.size(), static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i) EXPECT_EQ(logged[i]["global_step"], i);
}

// The two "nodes" of a group: `launch --nnodes 2` each, --nproc 2, running `train`.
std::vector<std::unique_ptr<Process>> two_nodes(const std::string& port,
                                                const std::vector<std::string>& train) {
  std::vector<std::unique_ptr<Process>> nodes;
  for (const char* node : {"0", "1"}) {
    std::vector<std::string> args = {"launch", "--nnodes",      "2",         "--node-rank",
                                     node,     "--master-addr", "127.0.0.1", "--master-port",
                                     port,     "--nproc",       "2",         "--"};
    args.insert(args.end(), train.begin(), train.end());
    nodes.push_back(std::make_unique<Process>(testing::slipstream_bin(), args));
  }
  return nodes;
}

TEST(ClusterTest, TwoLaunchesAsTwoNodesAreOneRunOfFourRanks) {
  if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
  testing::TempDir dir;
  const std::string port = std::to_string(testing::free_port());
  auto nodes = two_nodes(port, train_args(dir.path()));
  const Exit first = nodes[0]->wait(120s), second = nodes[1]->wait(30s);
  ASSERT_EQ(first.code, 0) << first.output;
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_OUTPUT_HAS(first,
                    "Launch: slipstream launch: rank 0 of 4 (node 0 of 2, local rank 0 of 2), "
                    "rendezvous at 127.0.0.1:" +
                        port);
  const std::string run = the_run(dir.path());
  expect_every_step_once(run, 4);  // 8 samples over 4 data ranks, 2 epochs
  const auto config = records(run + "/metrics.jsonl", "config");
  ASSERT_EQ(config.size(), 1u);
  const auto& launch = config[0]["distributed"];
  EXPECT_EQ(launch["launcher"], "slipstream launch");
  EXPECT_EQ(launch["world_size"], 4);
  EXPECT_EQ(launch["num_nodes"], 2);
  EXPECT_EQ(launch["ranks_per_node"], 2);
  EXPECT_EQ(launch["rendezvous"], "127.0.0.1:" + port);
}

// A rank that dies on one node stops its node (its launcher) and, through
// the process group's timeout, the other node.
TEST(ClusterTest, ARankKilledOnOneNodeStopsBothNodes) {
  if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
  testing::TempDir dir;
  auto train = train_args(dir.path());
  train.insert(train.end(),
               {"run_id=r", "training.steps_per_epoch=400", "distributed.timeout_s=10"});
  auto nodes = two_nodes(std::to_string(testing::free_port()), train);
  const auto logged = [&] {
    return fs::exists(dir.path() + "/r/metrics.jsonl")
               ? records(dir.path() + "/r/metrics.jsonl", "train_step").size()
               : 0;
  };
  ASSERT_TRUE(testing::eventually([&] { return logged() >= 3; }, 60s)) << nodes[0]->output();
  pid_t rank3 = -1;
  for (pid_t r : testing::children_of(nodes[1]->pid())) {
    std::ifstream in("/proc/" + std::to_string(r) + "/environ");
    const std::string env((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (env.find(std::string("RANK=3") + '\0') != std::string::npos) rank3 = r;
  }
  ASSERT_GT(rank3, 0);
  kill(rank3, SIGKILL);
  const Exit second = nodes[1]->wait(40s);
  EXPECT_NE(second.code, 0);
  EXPECT_OUTPUT_HAS(second, "launch: rank 3 was killed by signal 9");
  const Exit first = nodes[0]->wait(60s);
  EXPECT_TRUE(first.exited) << "node 0 still running a minute after rank 3 died";
  EXPECT_NE(first.code, 0) << first.output;
}

TEST(ClusterTest, LaunchAcrossNodesNeedsTheMasterAddressAndAValidNodeRank) {
  const auto train = train_args("/nonexistent");
  auto args =
      std::vector<std::string>{"launch", "--nnodes", "2", "--node-rank", "1", "--nproc", "1", "--"};
  args.insert(args.end(), train.begin(), train.end());
  Exit e = testing::run_slipstream(args, 20s);
  EXPECT_NE(e.code, 0);
  EXPECT_OUTPUT_HAS(e, "--nnodes 2 needs --master-addr");
  args[4] = "2";
  args.insert(args.begin() + 5, {"--master-addr", "127.0.0.1"});
  e = testing::run_slipstream(args, 20s);
  EXPECT_NE(e.code, 0);
  EXPECT_OUTPUT_HAS(e, "--node-rank 2 is not between 0 and 1");
}

// What srun exports to task `rank` of `world` tasks on one node.
std::vector<std::string> srun_task(int rank, int world, const std::string& port) {
  return {"SLURM_JOB_ID=4242",
          "SLURM_PROCID=" + std::to_string(rank),
          "SLURM_NTASKS=" + std::to_string(world),
          "SLURM_STEP_NUM_TASKS=" + std::to_string(world),
          "SLURM_LOCALID=" + std::to_string(rank),
          "SLURM_NODEID=0",
          "SLURM_NNODES=1",
          "SLURM_STEP_NUM_NODES=1",
          "SLURM_STEP_TASKS_PER_NODE=" + std::to_string(world),
          "SLURM_JOB_NODELIST=localhost",
          "MASTER_PORT=" + port};
}

TEST(ClusterTest, SrunTasksAreOneRun) {
  if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
  testing::TempDir dir;
  const std::string port = std::to_string(testing::free_port());
  std::vector<std::unique_ptr<Process>> tasks;
  for (int r = 0; r < 2; ++r) {
    tasks.push_back(std::make_unique<Process>(testing::slipstream_bin(), train_args(dir.path()),
                                              srun_task(r, 2, port)));
  }
  for (auto& t : tasks) {
    const Exit e = t->wait(120s);
    ASSERT_EQ(e.code, 0) << e.output;
  }
  const std::string run = the_run(dir.path());
  expect_every_step_once(run, 8);  // 8 samples over 2 ranks, 2 epochs
  const auto launch = records(run + "/metrics.jsonl", "config").at(0)["distributed"];
  EXPECT_EQ(launch["launcher"], "slurm");
  EXPECT_EQ(launch["world_size"], 2);
  EXPECT_EQ(launch["rendezvous"], "localhost:" + port);
  EXPECT_EQ(launch["rendezvous_from"], "first host of SLURM_JOB_NODELIST");
}

TEST(ClusterTest, AJobScriptWithoutSrunFailsBeforeAnyWorkSayingWhatToRun) {
  testing::TempDir dir;
  const Exit e = testing::run_slipstream(
      train_args(dir.path()), 30s,
      {"SLURM_JOB_ID=4243", "SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_NPROCS=4", "SLURM_LOCALID=0",
       "SLURM_NODEID=0", "SLURM_NNODES=1", "SLURM_JOB_NODELIST=gpu[01-04]"});
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, "not started by srun");
  EXPECT_OUTPUT_HAS(e, "srun slipstream train");
  EXPECT_TRUE(fs::is_empty(dir.path())) << "nothing written";
}

}  // namespace
}  // namespace slipstream
