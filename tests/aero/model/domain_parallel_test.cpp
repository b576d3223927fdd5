// Domain parallelism on Gloo: a sample's points sharded over 2 and 3 CPU
// ranks give the unsharded step on the whole sample (loss, outputs, every
// gradient, the next step's parameters) to fp32 round-off, and exact
// chunked inference over the ranks gives the unsharded output.
#include "aero/model/domain_parallel.h"
#include "aero/model/transolver.h"

#include "core/distributed/process_group.h"
#include "core/io/safetensors.h"
#include "support/multiprocess.h"
#include "support/recipe_support.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>

namespace slipstream::aero {
namespace {

using testing::relative_error;

TEST(PointShardTest, ShardsCoverThePointsOnceInOrder) {
  for (int size : {1, 2, 3, 7}) {
    int64_t next = 0;
    for (int r = 0; r < size; ++r) {
      const auto s = point_shard(299, r, size);
      EXPECT_EQ(s.begin, next);
      EXPECT_GE(s.count, 299 / size);
      EXPECT_LE(s.count, 299 / size + 1);
      next += s.count;
    }
    EXPECT_EQ(next, 299);
  }
}

struct Step {
  torch::Tensor out;
  double loss = 0;
  std::map<std::string, torch::Tensor> grads, next;
};

Transolver fixture_model(const SafetensorsFile& f) {
  Transolver model(testing::fixture_transolver_options(f));
  std::map<std::string, torch::Tensor> named(f.tensors.begin(), f.tensors.end());
  model->load_named(named, "param.");
  return model;
}

// One optimizer step of the fixture's small Transolver on points [begin,
// begin + count) of a 299-point sample, loss = sum of squares / 299 (this
// shard's part of the whole sample's mean); under a group, the loss and the
// gradients are summed over it.
Step step_on(const SafetensorsFile& f, Communicator* group, int64_t begin, int64_t count) {
  Transolver model = fixture_model(f);
  model->set_domain_group(group);
  const auto embedding = f.at("input.embedding").narrow(1, begin, count);
  const auto fx = f.at("input.fx").narrow(1, begin, count);
  Step s;
  s.out = model->forward(embedding, fx);
  auto loss = s.out.pow(2).sum() / 299.0;
  loss.backward();
  auto total = loss.detach().clone();
  if (group != nullptr) group->all_reduce_sum(total);
  s.loss = total.item<double>();
  // SGD with momentum and weight decay. (AdamW's first step is lr * sign(g)
  // per element, which turns round-off in a gradient element near zero into
  // a whole +-lr: seen up to 9.8e-5 relative on in_project_x.bias.) The
  // biases start at zero, so their next values carry the gradients' error.
  torch::optim::SGD opt(model->parameters(),
                        torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-4));
  for (const auto& p : model->named_parameters()) {
    auto g = p.value().grad();
    if (group != nullptr) group->all_reduce_sum(g);
    s.grads[p.key()] = g.clone();
  }
  opt.step();
  for (const auto& p : model->named_parameters()) s.next[p.key()] = p.value().detach().clone();
  return s;
}

void expect_sharded_step_equals_whole(int world) {
  testing::run_ranks(world, [world] {
    if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
    const auto env = DistributedEnv::from_environment();
    ASSERT_EQ(env.world_size, world);
    auto comm = init_process_group(env, c10::Device(c10::kCPU));
    const auto f = read_safetensors(testing::fixtures_dir() + "/transolver_small.safetensors");
    const Step whole = step_on(f, nullptr, 0, 299);
    const auto shard = point_shard(299, env.rank, world);
    const Step part = step_on(f, comm.get(), shard.begin, shard.count);
    const std::string who = std::to_string(world) + " ranks, rank " + std::to_string(env.rank);
    EXPECT_NEAR(part.loss, whole.loss, 1e-6 * whole.loss) << who;
    EXPECT_LT(relative_error(part.out, whole.out.narrow(1, shard.begin, shard.count)), 1e-5) << who;
    double worst_grad = 0, worst_next = 0;
    for (const auto& [name, g] : whole.grads) {
      const double e = relative_error(part.grads.at(name), g);
      worst_grad = std::max(worst_grad, e);
      EXPECT_LT(e, 1e-4) << who << " grad " << name;
      const double n = relative_error(part.next.at(name), whole.next.at(name));
      worst_next = std::max(worst_next, n);
      EXPECT_LT(n, 1e-4) << who << " next " << name;
    }
    if (env.rank == 0) {
      std::printf("%s: largest relative error, gradients %.2e, next parameters %.2e\n", who.c_str(),
                  worst_grad, worst_next);
    }
    // Exact chunked inference over the ranks: each its shard, in chunks of 7.
    Transolver model = fixture_model(f);
    model->set_domain_group(comm.get());
    torch::NoGradGuard no_grad;
    const ModelInputs inputs = {
        {"embedding", f.at("input.embedding").narrow(1, shard.begin, shard.count)},
        {"fx", f.at("input.fx").narrow(1, shard.begin, shard.count)}};
    const auto chunked = model->forward_in_chunks(inputs, 7);
    EXPECT_LT(relative_error(chunked, whole.out.narrow(1, shard.begin, shard.count)), 1e-5) << who;
  });
}

TEST(DomainParallelTest, TwoRankStepEqualsTheWholeSampleStep) {
  expect_sharded_step_equals_whole(2);
}

TEST(DomainParallelTest, ThreeRankStepEqualsTheWholeSampleStep) {
  expect_sharded_step_equals_whole(3);
}

}  // namespace
}  // namespace slipstream::aero
