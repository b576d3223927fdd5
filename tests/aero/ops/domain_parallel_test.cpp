// Domain parallelism on Gloo: a sample's points sharded over 2 and 3 CPU
// ranks give the unsharded step on the whole sample (loss, outputs, every
// gradient, the next step's parameters) to fp32 round-off, and exact
// chunked inference over the ranks gives the unsharded output; for
// Transolver and for GeoTransolver.
#include "aero/ops/domain_parallel.h"
#include "aero/model/geotransolver/geotransolver.h"
#include "aero/model/transolver/transolver.h"

#include "core/distributed/process_group.h"
#include "core/io/safetensors.h"
#include "support/multiprocess.h"
#include "support/recipe_support.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <functional>

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

// One optimizer step of `model` under `group` (null: the whole sample
// here), whose forward() gives this rank's points' output out of `n` in
// all: loss = sum of squares / n (this shard's part of the whole sample's
// mean); under a group the loss and the gradients are summed over it.
Step step_of(Model& model, Communicator* group, int64_t n,
             const std::function<torch::Tensor()>& forward) {
  model.set_domain_group(group);
  Step s;
  s.out = forward();
  auto loss = s.out.pow(2).sum() / static_cast<double>(n);
  loss.backward();
  auto total = loss.detach().clone();
  if (group != nullptr) group->all_reduce_sum(total);
  s.loss = total.item<double>();
  // SGD with momentum and weight decay. (AdamW's first step is lr * sign(g)
  // per element, which turns round-off in a gradient element near zero into
  // a whole +-lr: seen up to 9.8e-5 relative on in_project_x.bias.) The
  // biases start at zero, so their next values carry the gradients' error.
  torch::optim::SGD opt(model.parameters(),
                        torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-4));
  for (const auto& p : model.named_parameters()) {
    auto g = p.value().grad();
    if (group != nullptr) group->all_reduce_sum(g);
    s.grads[p.key()] = g.clone();
  }
  opt.step();
  for (const auto& p : model.named_parameters()) s.next[p.key()] = p.value().detach().clone();
  return s;
}

// The sharded step is the whole one: the loss, this shard's outputs, every
// gradient and every next parameter, to fp32 round-off.
void expect_same_step(const Step& part, const Step& whole, const PointShard& shard,
                      const std::string& who, double grad_bound = 1e-4) {
  EXPECT_NEAR(part.loss, whole.loss, 1e-6 * whole.loss) << who;
  EXPECT_LT(relative_error(part.out, whole.out.narrow(1, shard.begin, shard.count)), 1e-5) << who;
  double largest = 0;
  for (const auto& [name, g] : whole.grads) largest = std::max(largest, g.norm().item<double>());
  double worst_grad = 0, worst_next = 0;
  for (const auto& [name, g] : whole.grads) {
    // Relative, but to no less than 1e-3 of the largest gradient (sums that
    // cancel: the slice and key biases').
    const double e = (part.grads.at(name) - g).norm().item<double>() /
                     std::max(g.norm().item<double>(), 1e-3 * largest);
    worst_grad = std::max(worst_grad, e);
    EXPECT_LT(e, grad_bound) << who << " grad " << name;
    const double n = relative_error(part.next.at(name), whole.next.at(name));
    worst_next = std::max(worst_next, n);
    EXPECT_LT(n, 1e-4) << who << " next " << name;
  }
  std::printf("%s: largest relative error, gradients %.2e, next parameters %.2e\n", who.c_str(),
              worst_grad, worst_next);
}

void expect_sharded_step_equals_whole(int world) {
  testing::run_ranks(world, [world] {
    if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
    const auto env = DistributedEnv::from_environment();
    ASSERT_EQ(env.world_size, world);
    auto comm = init_process_group(env, c10::Device(c10::kCPU));
    const auto f = read_safetensors(testing::fixtures_dir() + "/transolver_small.safetensors");
    // 299 of the fixture's 300 points: no shard size divides them.
    const auto embedding = f.at("input.embedding").narrow(1, 0, 299);
    const auto fx = f.at("input.fx").narrow(1, 0, 299);
    const auto shard = point_shard(299, env.rank, world);
    Transolver whole_model = fixture_model(f), part_model = fixture_model(f);
    const Step whole =
        step_of(*whole_model, nullptr, 299, [&] { return whole_model->forward(embedding, fx); });
    const Step part = step_of(*part_model, comm.get(), 299, [&] {
      return part_model->forward(embedding.narrow(1, shard.begin, shard.count),
                                 fx.narrow(1, shard.begin, shard.count));
    });
    expect_same_step(part, whole, shard,
                     std::to_string(world) + " ranks, rank " + std::to_string(env.rank));
    // Exact chunked inference over the ranks: each its shard, in chunks of 7.
    Transolver model = fixture_model(f);
    model->set_domain_group(comm.get());
    torch::NoGradGuard no_grad;
    const ModelInputs inputs = {{"embedding", embedding.narrow(1, shard.begin, shard.count)},
                                {"fx", fx.narrow(1, shard.begin, shard.count)}};
    const auto chunked = model->forward_in_chunks(inputs, 7);
    EXPECT_LT(relative_error(chunked, whole.out.narrow(1, shard.begin, shard.count)), 1e-5);
  });
}

TEST(DomainParallelTest, TwoRankStepEqualsTheWholeSampleStep) {
  expect_sharded_step_equals_whole(2);
}

TEST(DomainParallelTest, ThreeRankStepEqualsTheWholeSampleStep) {
  expect_sharded_step_equals_whole(3);
}

// GeoTransolver: each rank holds its shard of local_embedding and every
// point of geometry and local_positions, searches its shard's neighbours
// among all of them, and sums its context projectors' and GALE layers' slice
// statistics over the group. With the points as one tensor for both (the
// recipe's inputs) and as two point sets.
void expect_sharded_geotransolver_step_equals_whole(int world) {
  testing::run_ranks(world, [world] {
    if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
    const auto env = DistributedEnv::from_environment();
    auto comm = init_process_group(env, c10::Device(c10::kCPU));
    const auto f =
        read_safetensors(testing::fixtures_dir() + "/geotransolver_small_volume.safetensors");
    // All the fixture's points but one: no shard size divides them.
    const int64_t n = f.at("input.local_embedding").size(1) - 1;
    ASSERT_NE(n % world, 0) << "shards of one size";
    const auto points = [&](const char* key) { return f.at(key).narrow(1, 0, n); };
    const auto embedding = points("input.local_embedding");
    const auto shard = point_shard(n, env.rank, world);
    for (const bool one_tensor : {true, false}) {
      const auto geometry = points("input.geometry");
      const auto positions = one_tensor ? geometry : points("input.local_positions");
      const auto inputs = [&](const torch::Tensor& local_embedding) {
        return ModelInputs{{"local_embedding", local_embedding},
                           {"geometry", geometry},
                           {"local_positions", positions},
                           {"global_embedding", f.at("input.global_embedding")}};
      };
      GeoTransolver whole_model = testing::fixture_geotransolver(f);
      GeoTransolver part_model = testing::fixture_geotransolver(f);
      const Step whole = step_of(*whole_model, nullptr, n,
                                 [&] { return whole_model->forward(inputs(embedding)); });
      const Step part = step_of(*part_model, comm.get(), n, [&] {
        return part_model->forward(inputs(embedding.narrow(1, shard.begin, shard.count)));
      });
      const std::string who = "GeoTransolver, " + std::to_string(world) + " ranks, rank " +
                              std::to_string(env.rank) +
                              (one_tensor ? ", points as one tensor" : ", points as two tensors");
      expect_same_step(part, whole, shard, who);
      // Exact chunked inference over the ranks, in chunks of 7, with the
      // weights the whole step started from.
      GeoTransolver model = testing::fixture_geotransolver(f);
      model->set_domain_group(comm.get());
      torch::NoGradGuard no_grad;
      const auto chunked =
          model->forward_in_chunks(inputs(embedding.narrow(1, shard.begin, shard.count)), 7);
      EXPECT_LT(relative_error(chunked, whole.out.narrow(1, shard.begin, shard.count)), 1e-5)
          << who;
    }
    // A rank given the whole sample instead of its shard: a clear error.
    GeoTransolver model = testing::fixture_geotransolver(f);
    model->set_domain_group(comm.get());
    const auto msg = testing::error_message_of([&] {
      model->forward({{"local_embedding", embedding},
                      {"geometry", points("input.geometry")},
                      {"local_positions", points("input.geometry")},
                      {"global_embedding", f.at("input.global_embedding")}});
    });
    EXPECT_NE(msg.find("domain rank " + std::to_string(env.rank)), std::string::npos) << msg;
  });
}

TEST(DomainParallelTest, TwoRankGeoTransolverStepEqualsTheWholeSampleStep) {
  expect_sharded_geotransolver_step_equals_whole(2);
}

TEST(DomainParallelTest, ThreeRankGeoTransolverStepEqualsTheWholeSampleStep) {
  expect_sharded_geotransolver_step_equals_whole(3);
}

}  // namespace
}  // namespace slipstream::aero
