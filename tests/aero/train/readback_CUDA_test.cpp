// CUDA proof of the readback contract (docs/design.md), run on a GPU by
// scripts/gpu_check.sh; skipped where no GPU is present.
//   - async readback of real CUDA steps is bitwise equal to a blocking one,
//     with and without masked targets, and starts/delivers with CUDA's sync
//     debugging set to "error" (any synchronizing call throws);
//   - a step that throws while copies are in flight delivers only a prefix
//     of landed steps, in order, without waiting;
//   - real training steps (loader, bf16 forward, loss, metrics, backward,
//     optimizer, readback) make no synchronizing call in the steady state.
#include "aero/config/config.h"
#include "aero/train/step_guard.h"
#include "aero/train/trainer.h"
#include "core/device/device.h"
#include "core/distributed/process_group.h"
#include "core/readback/step_readback.h"
#include "support/cuda_skip.h"
#include "support/multiprocess.h"
#include "support/recipe_support.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace slipstream::aero {
namespace {

// Restores the sync debug mode on scope exit.
struct SyncDebugScope {
  int previous = get_sync_debug_mode();
  explicit SyncDebugScope(int mode) { set_sync_debug_mode(mode); }
  ~SyncDebugScope() { set_sync_debug_mode(previous); }
};

StepScalars cuda_step(int64_t step, bool masked, const torch::Tensor& work) {
  auto opts = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(step);
  StepScalars s;
  // Depends on queued work, so the copy cannot land before it finishes.
  s.add("loss", work.mean() * 0 + torch::rand({}, opts));
  s.add("loss/pressure", torch::rand({}, opts.dtype(torch::kBFloat16)).to(torch::kFloat));
  if (masked) {
    s.add_counted("pressure_l2", torch::rand({}, opts),
                  torch::full({}, step % 3 == 0 ? 0.0f : 17.0f, opts));
  }
  s.add("nut_mae", torch::rand({}, opts));
  return s;
}

class ReadbackCudaTest : public ::testing::TestWithParam<bool> {};

TEST_P(ReadbackCudaTest, AsyncEqualsBlockingBitwiseWithoutAnySync_CUDA) {
  SKIP_WITHOUT_CUDA();
  const bool masked = GetParam();
  auto a = torch::randn({2048, 2048}, torch::kCUDA);
  std::vector<StepRecord> async_records, blocking_records;
  StepReadback async_rb([&](const StepRecord& r) { async_records.push_back(r); });
  StepReadback::Options bo;
  bo.policy = ReadbackPolicy::kBlocking;
  StepReadback blocking_rb([&](const StepRecord& r) { blocking_records.push_back(r); }, bo);
  std::vector<StepScalars> steps;
  for (int64_t i = 0; i < 20; ++i) {
    auto work = a;
    for (int k = 0; k < 4; ++k) work = torch::mm(work, a) / 2048.0;
    steps.push_back(cuda_step(i, masked, work));
  }
  for (int64_t i = 0; i < 20; ++i) {
    // Warm the pinned-memory cache outside the checked region.
    if (i == 0) async_rb.start(-1, steps[0]), async_rb.drain(), async_records.clear();
    {
      SyncDebugScope error_on_sync(2);
      async_rb.start(i, steps[i]);
      async_rb.deliver_landed();
    }
  }
  async_rb.drain();
  for (int64_t i = 0; i < 20; ++i) blocking_rb.start(i, steps[i]);
  ASSERT_EQ(async_records.size(), 20u);
  ASSERT_EQ(blocking_records.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(async_records[i].step, static_cast<int64_t>(i));
    for (size_t k = 0; k < async_records[i].values.size(); ++k) {
      const double x = async_records[i].values[k].second, y = blocking_records[i].values[k].second;
      EXPECT_EQ(std::memcmp(&x, &y, sizeof(double)), 0) << "step " << i << " key " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Masking, ReadbackCudaTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Masked" : "Unmasked"; });

TEST(ReadbackCudaErrorTest, ThrowWhileCopiesAreInFlightDeliversOnlyALandedPrefix_CUDA) {
  SKIP_WITHOUT_CUDA();
  auto a = torch::randn({4096, 4096}, torch::kCUDA);
  std::vector<int64_t> delivered;
  StepReadback rb([&](const StepRecord& r) { delivered.push_back(r.step); });
  int64_t started = 0;
  try {
    ReadbackScope scope(rb);
    for (int64_t i = 0; i < 12; ++i) {
      auto work = a;
      for (int k = 0; k < 3; ++k) work = torch::mm(work, a) / 4096.0;  // keeps the GPU busy
      rb.start(i, cuda_step(i, true, work));
      ++started;
      rb.deliver_landed();
    }
    throw std::runtime_error("bad sample at step 12");
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "bad sample at step 12");
  }
  EXPECT_EQ(rb.pending(), 0u);
  EXPECT_LT(delivered.size(), static_cast<size_t>(started))
      << "the GPU finished everything before the throw; the test proves nothing";
  for (size_t i = 0; i < delivered.size(); ++i) EXPECT_EQ(delivered[i], static_cast<int64_t>(i));
  synchronize_device(c10::Device(c10::kCUDA, 0));
}

TEST(TrainerCudaTest, SteadyStateStepsMakeNoSynchronizingCall_CUDA) {
  SKIP_WITHOUT_CUDA();
  testing::TempDir dir;
  auto run = build_run(
      testing::load_config({"device=cuda", "dataset.num_train=4", "dataset.num_val=1",
                            "dataset.points_per_sample=20000", "dataset.sampling_resolution=16384",
                            "training.steps_per_epoch=12", "output_dir=" + dir.path(), "run_id=r",
                            "loss.mask_nonfinite=true", "loss.weighting=volume"}),
      DistributedEnv{});
  Trainer trainer(*run);
  trainer.train_epoch(1);  // warm-up: allocator, pinned memory, cuBLAS handles
  // Count in warn mode...
  trainer.set_sync_audit(true);
  trainer.train_epoch(2);
  EXPECT_GT(trainer.sync_audit().steady_steps(), 0);
  EXPECT_EQ(trainer.sync_audit().total(), 0) << trainer.sync_audit_report();
  trainer.set_sync_audit(false);
  // The audit can see a sync: the blocking policy's .cpu() counts once a step.
  trainer.set_readback_policy(ReadbackPolicy::kBlocking);
  trainer.set_sync_audit(true);
  trainer.train_epoch(3);
  EXPECT_GE(trainer.sync_audit().count(Phase::kReadback), 10) << trainer.sync_audit_report();
  trainer.set_sync_audit(false);
  trainer.set_readback_policy(ReadbackPolicy::kAsync);
  // ...and in error mode every steady step must still run.
  trainer.set_step_hook([](int64_t i) {
    if (i == 2) set_sync_debug_mode(2);
  });
  EXPECT_NO_THROW(trainer.train_epoch(4));
  set_sync_debug_mode(0);
}

// Two GPUs through NCCL: async readback equals blocking readback bitwise and
// is the count-weighted all-rank mean. Needs 2 CUDA devices.
// The step guard's gradient check on CUDA (one multi-tensor kernel): a NaN
// or an Inf in any one of many gradients (of mixed sizes, one undefined)
// sets the gradients' flag (not this rank's bit: its loss is finite), finite
// ones do not, and the gradients come out bitwise as they went in.
TEST(StepGuardCudaTest, FlagsANonFiniteGradientAndLeavesTheGradientsAlone_CUDA) {
  SKIP_WITHOUT_CUDA();
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  const StepGuard guard(/*rank=*/2, /*world_size=*/4, /*lag=*/2);
  for (const float poison : {0.0f, NAN, INFINITY, -INFINITY}) {
    std::vector<torch::Tensor> grads;
    for (int64_t n : {300, 1, 70001, 448, 5}) grads.push_back(torch::randn({n}, opts));
    grads.insert(grads.begin() + 2, torch::Tensor());
    if (poison != 0.0f) grads[3][12345] = poison;
    std::vector<torch::Tensor> before;
    for (const auto& g : grads) before.push_back(g.defined() ? g.clone() : g);
    StepScalars scalars;
    guard.add_controls(scalars, torch::ones({}, opts), grads, false);
    double mask = -1, flag = -1;
    for (const auto& e : scalars.entries()) {
      if (e.key == "control/nonfinite_ranks") mask = e.value.item<double>();
      if (e.key == "control/nonfinite_gradients") flag = e.value.item<double>();
    }
    EXPECT_EQ(mask, 0.0) << poison;
    EXPECT_EQ(flag, poison != 0.0f ? 1.0 : 0.0) << poison;
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) continue;
      EXPECT_TRUE(torch::allclose(grads[i], before[i], 0.0, 0.0, /*equal_nan=*/true)) << i;
    }
  }
}

TEST(ReadbackNcclTest, TwoRankAsyncEqualsBlockingAndIsTheWeightedMean_CUDA) {
  SKIP_WITHOUT_CUDA();
  if (torch::cuda::device_count() < 2 && !testing::is_worker()) GTEST_SKIP() << "needs 2 GPUs";
  if (!has_nccl_backend()) GTEST_SKIP() << "no NCCL in this build";
  testing::run_ranks(2, [] {
    const auto env = DistributedEnv::from_environment();
    const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
    c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(device);
    auto comm = init_process_group(env, device);
    ASSERT_EQ(comm->backend_name(), "nccl");
    auto opts = torch::TensorOptions().device(device);
    std::vector<StepRecord> got, blocking;
    StepReadback::Options ao;
    ao.comm = comm.get();
    StepReadback async_rb([&](const StepRecord& r) { got.push_back(r); }, ao);
    StepReadback::Options bo = ao;
    bo.policy = ReadbackPolicy::kBlocking;
    StepReadback blocking_rb([&](const StepRecord& r) { blocking.push_back(r); }, bo);
    for (int64_t step = 0; step < 8; ++step) {
      StepScalars s;
      s.add("loss", torch::full({}, 1.0 + env.rank + 0.25 * step, opts));
      s.add_counted("weighted", torch::full({}, env.rank == 0 ? 1.0 : 4.0, opts),
                    torch::full({}, env.rank == 0 ? 1.0 : 3.0, opts));
      s.add_counted("nowhere", torch::full({}, NAN, opts), torch::zeros({}, opts));
      async_rb.start(step, s);
      async_rb.deliver_landed();
      blocking_rb.start(step, s);
    }
    async_rb.drain();
    ASSERT_EQ(got.size(), 8u);
    for (int64_t step = 0; step < 8; ++step) {
      EXPECT_EQ(got[step].values[0].second, 1.5 + 0.25 * step);
      EXPECT_EQ(got[step].values[1].second, 3.25);
      EXPECT_TRUE(std::isnan(got[step].values[2].second));
      for (size_t k = 0; k < 3; ++k) {
        const double x = got[step].values[k].second, y = blocking[step].values[k].second;
        EXPECT_EQ(std::memcmp(&x, &y, sizeof(double)), 0);
      }
    }
    comm->barrier();
  });
}

}  // namespace
}  // namespace slipstream::aero
