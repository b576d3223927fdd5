// Two processes on loopback, Gloo: the readback is the count-weighted
// all-rank mean, NaN where no rank has a finite target, and bitwise equal
// to the blocking readback of the same tensors.
#include "core/distributed/process_group.h"
#include "core/readback/step_readback.h"
#include "support/multiprocess.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace slipstream {
namespace {

StepScalars rank_step(int rank, int64_t step) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  StepScalars s;
  s.add("loss", at::full({}, 1.5 + rank + 0.125 * step, at::kFloat));
  // Finite on rank 0 only: the mean over rank 0 alone.
  s.add_counted("only_rank0", at::full({}, rank == 0 ? 0.25 : nan, at::kFloat),
                at::full({}, rank == 0 ? 10 : 0, at::kLong));
  // Finite nowhere: NaN.
  s.add_counted("nowhere", at::full({}, nan, at::kFloat), at::zeros({}, at::kLong));
  // Weighted: rank 0 has 1.0 over 1 target, rank 1 has 4.0 over 3.
  s.add_counted("weighted", at::full({}, rank == 0 ? 1.0 : 4.0, at::kFloat),
                at::full({}, rank == 0 ? 1 : 3, at::kLong));
  return s;
}

TEST(GlooReadbackTest, CountWeightedAllRankMean) {
  if (!has_gloo_backend()) GTEST_SKIP() << "this build has no Gloo backend";
  testing::run_ranks(2, [] {
    const auto env = DistributedEnv::from_environment();
    ASSERT_EQ(env.world_size, 2);
    auto comm = init_process_group(env, c10::Device(c10::kCPU));
    ASSERT_NE(comm, nullptr);
    EXPECT_EQ(comm->backend_name(), "gloo");
    std::vector<StepRecord> got;
    StepReadback::Options opts;
    opts.comm = comm.get();
    StepReadback readback([&](const StepRecord& r) { got.push_back(r); }, opts);
    std::vector<StepRecord> blocking;
    StepReadback::Options blocking_opts = opts;
    blocking_opts.policy = ReadbackPolicy::kBlocking;
    StepReadback reference([&](const StepRecord& r) { blocking.push_back(r); }, blocking_opts);
    for (int64_t step = 0; step < 4; ++step) {
      readback.start(step, rank_step(env.rank, step));
      reference.start(step, rank_step(env.rank, step));
      readback.deliver_landed();
    }
    readback.drain();
    ASSERT_EQ(got.size(), 4u);
    for (int64_t step = 0; step < 4; ++step) {
      const auto& v = got[step].values;
      EXPECT_EQ(got[step].step, step);
      EXPECT_EQ(v[0].second, 2.0 + 0.125 * step) << "rank " << env.rank;
      EXPECT_EQ(v[1].second, 0.25);
      EXPECT_TRUE(std::isnan(v[2].second));
      EXPECT_EQ(v[3].second, 3.25);
      // Blocking readback of the same tensors: the same bits.
      for (size_t i = 0; i < v.size(); ++i) {
        const double b = blocking[step].values[i].second;
        EXPECT_EQ(std::memcmp(&b, &v[i].second, sizeof(double)), 0) << v[i].first;
      }
    }
    comm->barrier();
  });
}

TEST(GlooReadbackTest, MissingMasterAddrIsAClearError) {
  setenv("WORLD_SIZE", "2", 1);
  setenv("RANK", "0", 1);
  unsetenv("MASTER_ADDR");
  try {
    DistributedEnv::from_environment();
    ADD_FAILURE() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_ADDR"), std::string::npos);
  }
  unsetenv("WORLD_SIZE");
  unsetenv("RANK");
}

}  // namespace
}  // namespace slipstream
