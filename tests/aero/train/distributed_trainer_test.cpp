// Two ranks on loopback through Gloo (CPU): bucketed gradient averaging
// equals a single process on both samples, parameters stay bitwise equal on
// every rank after every step, only rank 0 writes logs, and bad launches
// fail with clear errors instead of hanging.
#include "aero/model/transolver/transolver.h"
#include "aero/train/trainer.h"
#include "core/distributed/gradient_averager.h"
#include "core/distributed/process_group.h"
#include "support/multiprocess.h"
#include "support/recipe_support.h"
#include "support/test_support.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace slipstream::aero {
namespace {

TransolverOptions tiny_model() {
  TransolverOptions o;
  o.n_layers = 2;
  o.n_hidden = 32;
  o.n_head = 2;
  o.slice_num = 8;
  return o;
}

TEST(DistributedTest, BucketedAveragingEqualsOneProcessOnBothSamples) {
  if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
  testing::run_ranks(2, [] {
    const auto env = DistributedEnv::from_environment();
    auto comm = init_process_group(env, c10::Device(c10::kCPU));
    torch::manual_seed(0);
    Transolver model(tiny_model());
    // Small buckets so that several all-reduces overlap the backward.
    GradientAverager averager(model->parameters(), comm.get(), 16 * 1024);
    EXPECT_GT(averager.bucket_count(), 2u);
    torch::manual_seed(123);
    std::vector<torch::Tensor> emb{torch::randn({1, 200, 7}), torch::randn({1, 200, 7})};
    std::vector<torch::Tensor> fx{torch::randn({1, 200, 3}), torch::randn({1, 200, 3})};
    // Reference: one process, the mean of both samples' losses.
    auto reference = (model->forward(emb[0], fx[0]).pow(2).mean() +
                      model->forward(emb[1], fx[1]).pow(2).mean()) /
                     2;
    reference.backward();
    std::vector<torch::Tensor> want;
    for (auto& p : model->parameters()) {
      want.push_back(p.grad().clone());
      p.mutable_grad().zero_();
    }
    // Distributed: each rank its own sample.
    averager.prepare();
    model->forward(emb[env.rank], fx[env.rank]).pow(2).mean().backward();
    averager.finish();
    EXPECT_GT(averager.launched_during_backward(), 0u);
    size_t i = 0;
    for (auto& p : model->parameters()) {
      const double err =
          ((p.grad() - want[i]).norm() / want[i].norm().clamp_min(1e-30)).item<double>();
      EXPECT_LT(err, 1e-5) << "parameter " << i;
      ++i;
    }
    comm->barrier();
  });
}

std::vector<std::string> tiny_run(const std::string& out) {
  return {"model.n_layers=1",
          "model.n_hidden=32",
          "model.n_head=2",
          "model.slice_num=8",
          "dataset.num_train=8",
          "dataset.num_val=3",
          "dataset.points_per_sample=500",
          "dataset.sampling_resolution=200",
          "training.num_epochs=2",
          "output_dir=" + out,
          "run_id=d",
          "device=cpu",
          "logging.console_every_n_steps=100"};
}

// Runs `body` on 2 Gloo ranks that share one output directory.
void on_two_ranks(const std::function<void(const std::string& out, const DistributedEnv&)>& body) {
  testing::TempDir dir;
  const std::string out = testing::is_worker() ? std::getenv("SLIPSTREAM_TEST_DIR") : dir.path();
  testing::run_ranks(
      2, [&] { body(out, DistributedEnv::from_environment()); },
      "SLIPSTREAM_TEST_DIR=" + dir.path());
}

TEST(DistributedTest, TwoRankTrainingKeepsParametersBitwiseEqualAndRank0Logs) {
  if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
  on_two_ranks([](const std::string& out, const DistributedEnv& env) {
    auto run = build_run(testing::load_config(tiny_run(out)), env);
    Communicator* comm = run->comm.get();
    ASSERT_NE(comm, nullptr);
    Trainer trainer(*run);
    int64_t compared = 0;
    auto check_equal = [&] {
      std::vector<torch::Tensor> flat;
      for (auto& p : run->model->parameters()) flat.push_back(p.detach().reshape({-1}));
      auto mine = torch::cat(flat);
      auto hi = mine.clone(), lo = -mine;
      comm->all_reduce_max(hi);
      comm->all_reduce_max(lo);
      EXPECT_TRUE(torch::equal(hi, mine) && torch::equal(-lo, mine))
          << "rank " << env.rank << " diverged before step " << compared;
      ++compared;
    };
    trainer.set_step_hook([&](int64_t) { check_equal(); });
    trainer.fit();
    check_equal();
    EXPECT_EQ(compared, 9);  // 4 steps an epoch (8 samples / 2 ranks), 2 epochs, + after
    comm->barrier();
    if (env.rank == 0) {
      int64_t expect = 0;
      for (const auto& line : testing::read_lines(out + "/d/metrics.jsonl")) {
        auto j = nlohmann::json::parse(line);
        if (j["phase"] == "train_step") {
          EXPECT_EQ(j["global_step"], expect++);
        }
        if (j["phase"] == "dataset") {
          EXPECT_EQ(j["world_size"], 2);
          EXPECT_EQ(j["train_samples"], 4);  // per rank, as the recipe's sampler counts
        }
      }
      EXPECT_EQ(expect, 8);  // once each, written by rank 0 alone
    }
  });
}

// The train_step records' values by key, in step order.
std::vector<std::map<std::string, double>> train_steps(const std::string& jsonl) {
  std::vector<std::map<std::string, double>> steps;
  for (const auto& line : testing::read_lines(jsonl)) {
    const auto j = nlohmann::json::parse(line);
    if (j["phase"] != "train_step") continue;
    std::map<std::string, double> values;
    for (const auto& [key, v] : j.items()) {
      if (v.is_number_float()) values[key] = v.get<double>();
    }
    steps.push_back(values);
  }
  return steps;
}

// The sharded run logs the whole-sample one: the first step's values to
// fp32 round-off, the later steps' to AdamW's amplification of it (its first
// update is lr * sign(g)).
void expect_same_steps(const std::vector<std::map<std::string, double>>& sharded,
                       const std::vector<std::map<std::string, double>>& whole) {
  ASSERT_EQ(whole.size(), sharded.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    ASSERT_GT(whole[i].size(), 10u);
    for (const auto& [key, want] : whole[i]) {
      if (key == "lr" || key == "step_time_s" || key == "data_time_s" || key == "mem_gb") continue;
      ASSERT_TRUE(sharded[i].count(key)) << key;
      const double rel = std::abs(sharded[i].at(key) - want) / std::max(std::abs(want), 1e-12);
      EXPECT_LT(rel, i == 0 ? 1e-5 : 2e-3) << "step " << i << " " << key;
    }
  }
}

// distributed.domain_parallel=2 on 2 ranks: both take every sample, each a
// half of its points, and the run is the one-process run on whole samples.
TEST(DistributedTest, DomainParallelTrainingIsTheOneProcessRunOnWholeSamples) {
  if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
  on_two_ranks([](const std::string& out, const DistributedEnv& env) {
    auto overrides = tiny_run(out);
    overrides.push_back("training.num_epochs=1");
    overrides.push_back("distributed.domain_parallel=2");
    auto run = build_run(testing::load_config(overrides), env);
    ASSERT_EQ(run->domain_size, 2);
    ASSERT_EQ(run->data_world(), 1);
    Trainer(*run).fit();
    run->comm->barrier();
    if (env.rank != 0) return;
    auto single = tiny_run(out);
    single.push_back("training.num_epochs=1");
    single.push_back("run_id=whole");
    auto reference = build_run(testing::load_config(single), DistributedEnv{});
    Trainer(*reference).fit();
    const auto sharded = train_steps(out + "/d/metrics.jsonl");
    const auto whole = train_steps(out + "/whole/metrics.jsonl");
    ASSERT_EQ(sharded.size(), 8u);  // every sample on both ranks
    expect_same_steps(sharded, whole);
  });
}

// Data x domain: 4 ranks as 2 data ranks x 2 domain ranks (two subgroups
// of 2) log the 2-rank data-parallel run on whole samples. The two runs are
// two launches of this test; a worker's SLIPSTREAM_TEST_DIR is DIR#LAUNCH.
TEST(DistributedTest, DataTimesDomainIsTheDataParallelRunOnWholeSamples) {
  if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
  testing::TempDir dir;
  std::string out = dir.path(), phase;
  if (testing::is_worker()) {
    const std::string v = std::getenv("SLIPSTREAM_TEST_DIR");
    out = v.substr(0, v.rfind('#'));
    phase = v.substr(v.rfind('#') + 1);
  }
  const auto launch = [&](const std::string& name, int world, const std::string& extra) {
    testing::run_ranks(
        world,
        [&] {
          if (!phase.empty() && name != phase) return;  // a worker of the other launch
          auto overrides = tiny_run(out);
          overrides.push_back("training.num_epochs=1");
          overrides.push_back("run_id=" + name);
          if (!extra.empty()) overrides.push_back(extra);
          auto run = build_run(testing::load_config(overrides), DistributedEnv::from_environment());
          Trainer(*run).fit();
          run->comm->barrier();
        },
        "SLIPSTREAM_TEST_DIR=" + dir.path() + "#" + name);
  };
  launch("data", 2, "");
  launch("both", 4, "distributed.domain_parallel=2");
  if (testing::is_worker()) return;
  const auto sharded = train_steps(out + "/both/metrics.jsonl");
  const auto whole = train_steps(out + "/data/metrics.jsonl");
  ASSERT_EQ(sharded.size(), 4u);  // 8 samples over 2 data ranks
  expect_same_steps(sharded, whole);
}

TEST(DistributedTest, ADomainParallelThatDoesNotFitIsAClearError) {
  if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
  on_two_ranks([](const std::string& out, const DistributedEnv& env) {
    for (const char* d : {"3", "4"}) {
      auto overrides = tiny_run(out);
      overrides.push_back(std::string("distributed.domain_parallel=") + d);
      const auto msg =
          testing::error_message_of([&] { build_run(testing::load_config(overrides), env); });
      EXPECT_NE(msg.find("distributed.domain_parallel"), std::string::npos) << msg;
    }
  });
}

// GeoTransolver under distributed.domain_parallel=2: each rank gets its
// half of local_embedding and the targets, and every point of geometry and
// local_positions for its neighbour search (Model::whole_point_inputs), and
// the run is the one-process run on whole samples.
TEST(DistributedTest, DomainParallelGeoTransolverIsTheOneProcessRunOnWholeSamples) {
  if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
  on_two_ranks([](const std::string& out, const DistributedEnv& env) {
    auto geo = tiny_run(out);
    geo.erase(geo.begin(), geo.begin() + 4);  // the Transolver sizes
    geo.push_back("model=geotransolver_small");
    geo.push_back("training.num_epochs=1");
    geo.push_back("dataset.num_train=4");
    auto sharded_run = geo;
    sharded_run.push_back("distributed.domain_parallel=2");
    auto run = build_run(testing::load_config(sharded_run), env);
    ASSERT_EQ(run->loader.whole_inputs.count("geometry"), 1u);
    Trainer(*run).fit();
    run->comm->barrier();
    if (env.rank != 0) return;
    geo.push_back("run_id=whole");
    auto reference = build_run(testing::load_config(geo), DistributedEnv{});
    Trainer(*reference).fit();
    const auto sharded = train_steps(out + "/d/metrics.jsonl");
    ASSERT_EQ(sharded.size(), 4u);
    expect_same_steps(sharded, train_steps(out + "/whole/metrics.jsonl"));
  });
}

// Two ranks that would run different kernels (numerics.gemm) refuse to
// start: every rank names rank 1, and rank 1 names the key and both values.
TEST(DistributedTest, RanksWithDifferentConfigsFailNamingTheRankAndTheKey) {
  if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
  on_two_ranks([](const std::string& out, const DistributedEnv& env) {
    auto overrides = tiny_run(out);
    if (env.rank == 1) overrides.push_back("numerics.gemm=aten");
    try {
      build_run(testing::load_config(overrides), env);
      ADD_FAILURE() << "rank " << env.rank << ": a config mismatch must be an error";
    } catch (const c10::Error& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_NE(msg.find("rank(s) 1"), std::string::npos) << msg;
      if (env.rank == 1) {
        EXPECT_NE(msg.find("numerics.gemm 'aten' (rank 0: 'tuned')"), std::string::npos) << msg;
      }
    }
  });
}

TEST(DistributedTest, PortInUseIsAClearErrorNotAHang) {
  if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  DistributedEnv env;
  env.rank = 0;
  env.world_size = 2;
  env.master_addr = "127.0.0.1";
  env.master_port = ntohs(addr.sin_port);
  ProcessGroupOptions opts;
  opts.timeout = std::chrono::seconds(5);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    init_process_group(env, c10::Device(c10::kCPU), opts);
    ADD_FAILURE() << "hosting the store on a busy port must fail";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find(std::to_string(env.master_port)), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  close(fd);
}

TEST(DistributedTest, ARankThatDiesMakesTheOthersFailWithinTheTimeout) {
  if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
  const auto t0 = std::chrono::steady_clock::now();
  testing::run_ranks(2, [&] {
    const auto env = DistributedEnv::from_environment();
    ProcessGroupOptions opts;
    opts.timeout = std::chrono::seconds(5);
    auto comm = init_process_group(env, c10::Device(c10::kCPU), opts);
    if (env.rank == 1) _exit(0);  // dies before the collective
    auto t = torch::ones({4});
    EXPECT_THROW(comm->all_reduce_sum(t), std::exception);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
}

}  // namespace
}  // namespace slipstream::aero
