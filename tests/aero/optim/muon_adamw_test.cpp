// Muon against torch.optim.Muon (the fixture), AdamW against its closed form.
#include "aero/optim/muon_adamw.h"
#include "core/io/safetensors.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace slipstream::aero {
namespace {

using testing::relative_error;

TEST(MuonTest, TwoStepsMatchTorchOptimMuon) {
  const auto f = read_safetensors(testing::fixtures_dir() + "/muon_two_steps.safetensors");
  for (const std::string m : {"wide", "tall"}) {
    auto param = f.at(m + ".param0").clone();
    auto buffer = torch::zeros_like(param);
    MuonOptions o;
    muon_update(param, f.at(m + ".grad1"), buffer, 0.02, 0.1, o);
    const double e1 = relative_error(param, f.at(m + ".param1"));
    muon_update(param, f.at(m + ".grad2"), buffer, 0.02, 0.1, o);
    const double e2 = relative_error(param, f.at(m + ".param2"));
    EXPECT_LT(e1, 1e-6) << m;
    EXPECT_LT(e2, 1e-6) << m;
    // The step moved the parameter: the comparison is not vacuous.
    EXPECT_GT(relative_error(f.at(m + ".param0"), f.at(m + ".param2")), 1e-3) << m;
  }
}

TEST(MuonTest, OrthogonalisedUpdateHasSingularValuesNearOne) {
  torch::manual_seed(0);
  auto g = torch::randn({32, 64});
  auto o = newton_schulz_orthogonalize(g, MuonOptions{}).to(torch::kFloat);
  auto s = torch::linalg_svdvals(o);
  EXPECT_GT(s.min().item<double>(), 0.5);
  EXPECT_LT(s.max().item<double>(), 1.3);
}

TEST(MuonAdamWTest, BatchedStepEqualsOneMatrixAtATime) {
  torch::manual_seed(3);
  // Three matrices of one shape (one stack), one of another, one tall.
  std::vector<torch::Tensor> ps{torch::randn({8, 16}), torch::randn({8, 16}), torch::randn({8, 16}),
                                torch::randn({12, 6}), torch::randn({20, 4})};
  std::vector<std::pair<std::string, torch::Tensor>> named;
  std::vector<torch::Tensor> refs, bufs;
  for (size_t i = 0; i < ps.size(); ++i) {
    named.emplace_back("p" + std::to_string(i), ps[i].clone().requires_grad_(true));
    refs.push_back(ps[i].clone());
    bufs.push_back(torch::zeros_like(ps[i]));
  }
  OptimizerOptions opts;
  opts.lr = 0.02;
  opts.weight_decay = 0.1;
  MuonAdamW opt(named, opts);
  ASSERT_EQ(opt.muon_parameter_count(), ps.size());
  for (int step = 0; step < 2; ++step) {
    for (size_t i = 0; i < ps.size(); ++i) {
      const auto g = torch::randn_like(ps[i]);
      named[i].second.mutable_grad() = g.clone();
      muon_update(refs[i], g, bufs[i], opts.lr, opts.weight_decay, opts.muon);
    }
    opt.step();
  }
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_LT(relative_error(named[i].second.detach(), refs[i]), 1e-6) << named[i].first;
    EXPECT_GT(relative_error(ps[i], refs[i]), 1e-3) << named[i].first;  // it moved
  }
}

// zero_grad drops the gradients (set_to_none): the next backward's are the
// new ones alone, not added to the old, and a step then leaves a parameter
// that got none as it is.
TEST(MuonAdamWTest, ZeroGradDropsEveryGradientAndTheNextBackwardStartsFresh) {
  auto w = torch::randn({4, 3}, torch::requires_grad());
  auto b = torch::randn({3}, torch::requires_grad());
  auto unused = torch::randn({2}, torch::requires_grad());  // never gets a gradient
  MuonAdamW opt({{"w", w}, {"b", b}, {"unused", unused}}, OptimizerOptions{});
  const auto loss = [&] { return (torch::ones({2, 4}).mm(w) + b).pow(2).sum(); };
  loss().backward();
  const auto gw = w.grad().clone(), gb = b.grad().clone();
  ASSERT_GT(gw.abs().sum().item<double>(), 0.0);
  opt.zero_grad();
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  EXPECT_FALSE(unused.grad().defined());
  loss().backward();
  EXPECT_TRUE(torch::equal(w.grad(), gw));
  EXPECT_TRUE(torch::equal(b.grad(), gb));
  const auto unused_before = unused.detach().clone(), w_before = w.detach().clone();
  opt.step();
  EXPECT_TRUE(torch::equal(unused.detach(), unused_before));
  EXPECT_FALSE(torch::equal(w.detach(), w_before));
}

TEST(MuonAdamWTest, SplitsMatricesFromTheRestAndAdamWMatchesTheClosedForm) {
  auto w = torch::randn({4, 3}, torch::requires_grad());
  auto b = torch::randn({3}, torch::requires_grad());
  OptimizerOptions opts;
  opts.lr = 0.1;
  opts.weight_decay = 0.01;
  MuonAdamW opt({{"w", w}, {"b", b}}, opts);
  EXPECT_EQ(opt.muon_parameter_count(), 1u);
  EXPECT_EQ(opt.adamw_parameter_count(), 1u);
  auto b0 = b.detach().clone();
  (w.sum() + (b * b).sum()).backward();
  auto g = b.grad().clone();
  opt.step();
  // First AdamW step: m = (1-b1) g, v = (1-b2) g^2, bias-corrected to g and g^2.
  auto expected = b0 * (1 - 0.1 * 0.01) - 0.1 * g / (g.abs() + 1e-8);
  EXPECT_LT((b.detach() - expected).abs().max().item<double>(), 1e-6);
  // State round trip.
  std::map<std::string, torch::Tensor> state;
  for (auto& [k, v] : opt.state_tensors()) state[k] = v.clone();
  MuonAdamW other({{"w", w}, {"b", b}}, opts);
  other.load_state_tensors(state);
  EXPECT_EQ(other.steps_taken(), 1);
}

}  // namespace
}  // namespace slipstream::aero
