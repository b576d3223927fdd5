// Many ranks on loopback through Gloo, as a cluster runs them: 8 data-parallel
// ranks, 2 x 2 and 4 x 2 data x domain. Each rank's averaged gradient is the
// single process's mean over the same samples of the whole-sample gradients,
// for Transolver and GeoTransolver, and the parameters stay bitwise equal on
// every rank. Data rank d takes sample d; domain rank k its shard of the
// points; the loss and the averaging are the trainer's (domain_sum over the
// domain group, GradientAverager over the world).
#include "aero/model/geotransolver/geotransolver.h"
#include "aero/model/transolver/transolver.h"
#include "aero/ops/domain_parallel.h"

#include "core/distributed/gradient_averager.h"
#include "core/distributed/process_group.h"
#include "core/io/safetensors.h"
#include "support/multiprocess.h"
#include "support/recipe_support.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <map>
#include <string>

namespace slipstream::aero {
namespace {

// Sample s's inputs (whole), and the same restricted to a shard's points.
using Inputs = std::function<ModelInputs(int sample, const PointShard& shard)>;

struct Family {
  std::string name;
  std::function<ModelPtr()> model;  // the same weights on every call
  int64_t points = 0;
  Inputs inputs;
};

// A perturbation of `x` that is the same on every rank: sample s's own.
torch::Tensor variant(const torch::Tensor& x, int sample) {
  torch::manual_seed(1000 + sample);
  return x + 0.1 * torch::randn(x.sizes());
}

Family transolver_family() {
  const auto f = read_safetensors(testing::fixtures_dir() + "/transolver_small.safetensors");
  const int64_t n = f.at("input.embedding").size(1) - 1;  // no shard size divides it
  Family fam{"Transolver", nullptr, n, nullptr};
  fam.model = [f] {
    Transolver m(testing::fixture_transolver_options(f));
    std::map<std::string, torch::Tensor> named(f.tensors.begin(), f.tensors.end());
    m->load_named(named, "param.");
    return ModelPtr(m.ptr());
  };
  const auto embedding = f.at("input.embedding").narrow(1, 0, n);
  const auto fx = f.at("input.fx").narrow(1, 0, n);
  fam.inputs = [embedding, fx](int s, const PointShard& p) {
    return ModelInputs{{"embedding", variant(embedding, s).narrow(1, p.begin, p.count)},
                       {"fx", variant(fx, s).narrow(1, p.begin, p.count)}};
  };
  return fam;
}

Family geotransolver_family() {
  const auto f =
      read_safetensors(testing::fixtures_dir() + "/geotransolver_small_volume.safetensors");
  const int64_t n = f.at("input.local_embedding").size(1) - 1;
  Family fam{"GeoTransolver", nullptr, n, nullptr};
  fam.model = [f] { return ModelPtr(testing::fixture_geotransolver(f).ptr()); };
  const auto embedding = f.at("input.local_embedding").narrow(1, 0, n);
  const auto geometry = f.at("input.geometry").narrow(1, 0, n);
  const auto global = f.at("input.global_embedding");
  fam.inputs = [embedding, geometry, global](int s, const PointShard& p) {
    return ModelInputs{{"local_embedding", variant(embedding, s).narrow(1, p.begin, p.count)},
                       {"geometry", geometry},
                       {"local_positions", geometry},
                       {"global_embedding", global}};
  };
  return fam;
}

std::map<std::string, torch::Tensor> gradients(Model& model) {
  std::map<std::string, torch::Tensor> g;
  for (const auto& p : model.named_parameters()) g[p.key()] = p.value().grad().clone();
  return g;
}

// The single process: the mean over `samples` of each whole sample's loss
// (sum of squares / points), one backward.
std::map<std::string, torch::Tensor> one_process_mean_gradient(const Family& fam, int samples) {
  auto model = fam.model();
  const PointShard all{0, fam.points};
  torch::Tensor total;
  for (int s = 0; s < samples; ++s) {
    auto loss = model->forward(fam.inputs(s, all)).pow(2).sum() / static_cast<double>(fam.points);
    total = total.defined() ? total + loss : loss;
  }
  (total / static_cast<double>(samples)).backward();
  return gradients(*model);
}

// Runs `data` x `domain` ranks and checks, on every rank, each family's
// averaged gradient against the single process's, and that the parameters
// after an SGD step are bitwise equal on every rank.
void expect_ranks_equal_one_process(int data, int domain) {
  const int world = data * domain;
  testing::run_ranks(world, [=] {
    if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
    const auto env = DistributedEnv::from_environment();
    ASSERT_EQ(env.world_size, world);
    auto comm = init_process_group(env, c10::Device(c10::kCPU));
    const int data_rank = env.rank / domain, domain_rank = env.rank % domain;
    std::unique_ptr<Communicator> sub;
    Communicator* domain_group = nullptr;
    if (domain == world) {
      domain_group = comm.get();
    } else if (domain > 1) {
      std::vector<int> members;
      for (int r = 0; r < domain; ++r) members.push_back(data_rank * domain + r);
      sub = comm->subgroup(members);
      domain_group = sub.get();
    }
    for (const Family& fam : {transolver_family(), geotransolver_family()}) {
      const std::string who = fam.name + ", " + std::to_string(data) + " x " +
                              std::to_string(domain) + " ranks, rank " + std::to_string(env.rank);
      const auto want = one_process_mean_gradient(fam, data);
      auto model = fam.model();
      model->set_domain_group(domain_group);
      GradientAverager averager(model->parameters(), comm.get(), 64 * 1024);
      const auto shard = point_shard(fam.points, domain_rank, domain);
      averager.prepare();
      const auto part = model->forward(fam.inputs(data_rank, shard));
      (domain_sum(part.pow(2).sum(), domain_group) / static_cast<double>(fam.points)).backward();
      averager.finish();
      const auto got = gradients(*model);
      double largest = 0, worst = 0;
      for (const auto& [name, g] : want) largest = std::max(largest, g.norm().item<double>());
      for (const auto& [name, g] : want) {
        // Relative, to no less than 1e-3 of the largest gradient (sums that cancel).
        const double e = (got.at(name) - g).norm().item<double>() /
                         std::max(g.norm().item<double>(), 1e-3 * largest);
        worst = std::max(worst, e);
        EXPECT_LT(e, 1e-5) << who << " grad " << name;
      }
      std::printf("%s: largest relative gradient error against one process %.2e\n", who.c_str(),
                  worst);
      // One step from the averaged gradient: bitwise the same parameters on
      // every rank (the max and the min over the ranks are this rank's).
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      opt.step();
      std::vector<torch::Tensor> flat;
      for (auto& p : model->parameters()) flat.push_back(p.detach().reshape({-1}));
      const auto mine = torch::cat(flat);
      auto hi = mine.clone(), lo = -mine;
      comm->all_reduce_max(hi);
      comm->all_reduce_max(lo);
      EXPECT_TRUE(torch::equal(hi, mine) && torch::equal(-lo, mine)) << who;
    }
    comm->barrier();
  });
}

TEST(ManyRanksTest, EightDataParallelRanksAreTheOneProcessMeanStep) {
  expect_ranks_equal_one_process(8, 1);
}

TEST(ManyRanksTest, TwoDataTimesTwoDomainRanksAreTheOneProcessMeanStep) {
  expect_ranks_equal_one_process(2, 2);
}

TEST(ManyRanksTest, FourDataTimesTwoDomainRanksAreTheOneProcessMeanStep) {
  expect_ranks_equal_one_process(4, 2);
}

}  // namespace
}  // namespace slipstream::aero
