// Loss and metrics against hand-computed values, masking with counts, and
// area/volume weighting.
#include "aero/loss/loss_calculator.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

namespace slipstream::aero {
namespace {

FieldSpec scalar(const std::string& name, double weight = 1.0) {
  return {name, FieldType::kScalar, Nondim::kIdentity, {}, 1.0, weight};
}

FieldSpec vector(const std::string& name) {
  return {name, FieldType::kVector, Nondim::kIdentity, {}, 1.0, 1.0};
}

double value_of(const StepScalars& s, const std::string& key) {
  for (const auto& e : s.entries()) {
    if (e.key == key) return e.value.item<double>();
  }
  ADD_FAILURE() << "no key " << key;
  return NAN;
}

const StepScalars::Entry* entry_of(const StepScalars& s, const std::string& key) {
  for (const auto& e : s.entries()) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

TEST(LossCalculatorTest, MseAndMetricsMatchHandComputedValues) {
  LossOptions o;
  o.type = "mse";
  o.fields = FieldSchema({vector("velocity"), scalar("pressure", 2.0)});
  LossCalculator calc(o);
  torch::manual_seed(3);
  auto p = torch::randn({1, 50, 4});
  auto t = torch::randn({1, 50, 4});
  auto r = calc.compute(p, t);
  auto d = (p - t).view({-1, 4});
  auto tt = t.view({-1, 4});
  const double vel = (d.narrow(1, 0, 3).pow(2).mean(0)).sum().item<double>();
  const double pre = d.narrow(1, 3, 1).pow(2).mean().item<double>();
  EXPECT_NEAR(value_of(r.scalars, "loss/velocity"), vel, 1e-5);
  // Per-field losses carry their weight, as the recipe logs them.
  EXPECT_NEAR(value_of(r.scalars, "loss/pressure"), 2.0 * pre, 1e-5);
  EXPECT_NEAR(r.total.item<double>(), (vel + 2.0 * pre) / 4.0, 1e-5);
  EXPECT_NEAR(value_of(r.scalars, "pressure_l2"),
              (d.narrow(1, 3, 1).norm() / tt.narrow(1, 3, 1).norm()).item<double>(), 1e-5);
  EXPECT_NEAR(value_of(r.scalars, "velocity_y_l1"),
              (d.select(1, 1).abs().sum() / tt.select(1, 1).abs().sum()).item<double>(), 1e-5);
  EXPECT_NEAR(value_of(r.scalars, "velocity_l2"),
              (d.narrow(1, 0, 3).norm() / tt.narrow(1, 0, 3).norm()).item<double>(), 1e-5);
  EXPECT_NEAR(value_of(r.scalars, "velocity_mae"), d.narrow(1, 0, 3).abs().mean().item<double>(),
              1e-5);
  // Keys as documented, in order.
  std::vector<std::string> keys;
  for (const auto& e : r.scalars.entries()) keys.push_back(e.key);
  EXPECT_EQ(keys, calc.keys());
  EXPECT_FALSE(r.scalars.has_counts());
}

TEST(LossCalculatorTest, HuberAndRelativeMse) {
  LossOptions o;
  o.fields = FieldSchema({scalar("pressure")});
  auto p = torch::tensor({0.0f, 0.0f, 0.0f}).view({3, 1});
  auto t = torch::tensor({0.5f, 2.0f, -3.0f}).view({3, 1});
  o.type = "huber";
  EXPECT_NEAR(LossCalculator(o).compute(p, t).total.item<double>(), (0.125 + 1.5 + 2.5) / 3, 1e-6);
  o.type = "rmse";
  EXPECT_NEAR(LossCalculator(o).compute(p, t).total.item<double>(), 1.0, 1e-6);
  o.type = "l7";
  EXPECT_THROW(LossCalculator{o}, c10::Error);
}

TEST(LossCalculatorTest, MaskedTargetsAreLeftOutAndCarryCounts) {
  LossOptions o;
  o.type = "mse";
  o.mask_nonfinite = true;
  o.fields = FieldSchema({scalar("pressure"), scalar("nut")});
  auto p = torch::tensor({1.0f, 1.0f, 2.0f, 2.0f, 3.0f, 3.0f}).view({3, 2});
  auto t = torch::tensor({0.0f, NAN, 2.0f, NAN, 5.0f, NAN}).view({3, 2});
  auto r = LossCalculator(o).compute(p, t);
  EXPECT_NEAR(value_of(r.scalars, "loss/pressure"), (1.0 + 0.0 + 4.0) / 3, 1e-6);
  EXPECT_TRUE(std::isnan(value_of(r.scalars, "nut_l2")));
  ASSERT_NE(entry_of(r.scalars, "nut_l2"), nullptr);
  EXPECT_EQ(entry_of(r.scalars, "nut_l2")->finite_count.item<double>(), 0.0);
  EXPECT_EQ(entry_of(r.scalars, "pressure_mae")->finite_count.item<double>(), 3.0);
  EXPECT_NEAR(value_of(r.scalars, "pressure_mae"), (1.0 + 0.0 + 2.0) / 3, 1e-6);
}

TEST(LossCalculatorTest, WeightsByCellVolume) {
  LossOptions o;
  o.type = "mse";
  o.fields = FieldSchema({scalar("pressure")});
  auto p = torch::zeros({2, 1});
  auto t = torch::tensor({1.0f, 3.0f}).view({2, 1});
  auto w = torch::tensor({3.0f, 1.0f});
  auto r = LossCalculator(o).compute(p, t, w);
  EXPECT_NEAR(r.total.item<double>(), (3 * 1.0 + 1 * 9.0) / 4.0, 1e-6);
  EXPECT_NEAR(value_of(r.scalars, "pressure_mae"), (3 * 1.0 + 1 * 3.0) / 4.0, 1e-6);
}

TEST(LossCalculatorTest, GradientFlowsToThePrediction) {
  LossCalculator calc(LossOptions{});
  auto p = torch::randn({1, 10, 5}, torch::requires_grad());
  auto r = calc.compute(p, torch::randn({1, 10, 5}));
  r.total.backward();
  EXPECT_GT(p.grad().abs().sum().item<double>(), 0.0);
}

// loss.forces: the batch's weights map the error to coefficient errors dC
// (B, K); the total adds weight * mean_b sum_k (dC_k / scale)^2.
TEST(LossCalculatorTest, TheForceTermAddsTheCoefficientErrors) {
  LossOptions o;
  o.type = "mse";
  o.fields = FieldSchema({{"pressure", FieldType::kScalar, Nondim::kPressure, {}, 1.0, 1.0},
                          {"wss", FieldType::kVector, Nondim::kStress, {}, 1.0, 1.0}});
  o.forces.weight = 0.5;
  o.forces.scale = 0.1;
  o.forces.coefficients = {"CD", "CL"};
  LossCalculator calc(o);
  EXPECT_EQ(calc.keys()[3], "loss/forces");
  EXPECT_EQ(calc.keys().back(), "CL_error");
  torch::manual_seed(3);
  const auto t = torch::randn({2, 6, 4});
  auto p = (t + 0.1 * torch::randn({2, 6, 4})).requires_grad_();
  const auto w = torch::randn({2, 6, 4, 2});
  const auto r = calc.compute(p, t, {}, w);
  const auto dc = ((p - t).detach().unsqueeze(-1) * w).sum(torch::IntArrayRef{1, 2});  // (B, K)
  const double base = (p - t).detach().square().mean().item<double>();
  const double force = 0.5 * (dc / 0.1).square().sum(1).mean().item<double>();
  EXPECT_NEAR(r.total.item<double>(), base + force, 1e-5 * (base + force));
  EXPECT_NEAR(value_of(r.scalars, "loss/forces"), force, 1e-5 * force);
  EXPECT_NEAR(value_of(r.scalars, "CD_error"), dc.select(1, 0).abs().mean().item<double>(), 1e-6);
  EXPECT_NEAR(value_of(r.scalars, "CL_error"), dc.select(1, 1).abs().mean().item<double>(), 1e-6);
  // Its gradient: d/dp of 0.5 * mean_b sum_k (dC_k / s)^2 = (1 / B) * W dC / s^2.
  auto only_force = calc.compute(p, t, {}, w);
  const auto force_term = only_force.total - (p - t).square().mean();
  force_term.backward();
  const auto expected = (w * (dc / (0.1 * 0.1) / 2.0).view({2, 1, 1, 2})).sum(3);
  EXPECT_TRUE(torch::allclose(p.grad(), expected, 1e-4, 1e-5));
  // Without the batch's weights, or without the fields to integrate, it refuses.
  EXPECT_THROW(calc.compute(p, t), c10::Error);
  LossOptions volume;
  volume.forces.weight = 1.0;
  EXPECT_THROW(LossCalculator{volume}, c10::Error);
}

}  // namespace
}  // namespace slipstream::aero
