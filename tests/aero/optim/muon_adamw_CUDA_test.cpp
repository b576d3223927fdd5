// The optimizer on the GPU (run by scripts/gpu_check.sh; skipped without
// CUDA): the fused AdamW kernel against the foreach passes it replaces.
#include "aero/optim/muon_adamw.h"
#include "core/device/device.h"

#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

namespace slipstream::aero {
namespace {

using testing::relative_error;

// Three steps of Muon + AdamW on a small model's worth of tensors (matrices,
// vectors, a scalar, one parameter that gets no gradient), from the same
// start and gradients, with AdamW fused and not.
TEST(MuonAdamWCudaTest, FusedAdamWMatchesTheForeachPassesToRoundOff_CUDA) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device dev(torch::kCUDA, 0);
  ASSERT_TRUE(fused_adamw_applies(torch::zeros({1}, dev))) << "LibTorch here has no fused AdamW";
  torch::manual_seed(5);
  const std::vector<std::vector<int64_t>> shapes{{64, 48}, {48}, {1, 1, 8, 1}, {}, {300}, {7}};
  std::vector<torch::Tensor> start, grads;
  for (const auto& s : shapes) {
    start.push_back(torch::randn(s, dev));
    grads.push_back(torch::randn(s, dev) * 0.1);
  }
  for (const std::string name : {"muon", "adamw"}) {
    std::vector<torch::Tensor> result[2];
    for (int fused = 0; fused < 2; ++fused) {
      std::vector<std::pair<std::string, torch::Tensor>> named;
      for (size_t i = 0; i < shapes.size(); ++i) {
        named.emplace_back("p" + std::to_string(i), start[i].clone().requires_grad_());
      }
      OptimizerOptions o;
      o.name = name;
      o.lr = 0.01;
      o.weight_decay = 0.1;
      o.adamw.fused = fused == 1;
      MuonAdamW opt(named, o);
      for (int step = 1; step <= 3; ++step) {
        opt.zero_grad();
        for (size_t i = 0; i + 1 < named.size(); ++i) {  // the last one gets none
          named[i].second.mutable_grad() = grads[i] * step;
        }
        opt.step();
      }
      for (auto& [n, p] : named) result[fused].push_back(p.detach().cpu());
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_LT(relative_error(result[1][i], result[0][i]), 1e-6) << name << " p" << i;
    }
    // The steps moved the parameters (the comparison is not vacuous), and the
    // one with no gradient was left alone by both.
    EXPECT_GT(relative_error(result[1][1], start[1].cpu()), 1e-3) << name;
    EXPECT_TRUE(torch::equal(result[1].back(), start.back().cpu())) << name;
  }
}

}  // namespace
}  // namespace slipstream::aero
