// StepReadback on CPU: ordering, exactly-once delivery, held steps, the
// error path, per-step host fields, and bitwise equality with a blocking
// readback (docs/design.md, "The readback contract").
#include "core/readback/step_readback.h"
#include "support/test_support.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace slipstream {
namespace {

using testing::HeldSteps;

// A step's scalars, with values that differ per step and (optionally) a
// masked metric whose count is zero at every fourth step.
StepScalars make_step(int64_t step, bool masked) {
  at::manual_seed(1000 + step);
  StepScalars s;
  s.add("loss", at::rand({}) * 3);
  s.add("loss/velocity", at::rand({}, at::kFloat));
  s.add("loss/pressure", at::rand({}, at::kDouble));
  if (masked) {
    const int64_t count = step % 4 == 0 ? 0 : 100 + step;
    at::Tensor v =
        count == 0 ? at::full({}, std::numeric_limits<float>::quiet_NaN()) : at::rand({});
    s.add_counted("pressure_l2", v, at::full({}, count, at::kLong));
  }
  s.add("velocity_x_mae", at::rand({}));
  return s;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

class StepReadbackTest : public ::testing::TestWithParam<bool> {};

TEST_P(StepReadbackTest, DeliversEveryStepOnceInOrderBitwiseEqualToBlocking) {
  const bool masked = GetParam();
  std::vector<StepRecord> got;
  HeldSteps held;
  StepReadback::Options opts;
  opts.probe = held.probe();
  StepReadback readback([&](const StepRecord& r) { got.push_back(r); }, opts);
  std::vector<StepRecord> blocking;
  StepReadback::Options blocking_opts;
  blocking_opts.policy = ReadbackPolicy::kBlocking;
  StepReadback reference([&](const StepRecord& r) { blocking.push_back(r); }, blocking_opts);
  const int64_t n = 12;
  for (int64_t step = 0; step < n; ++step) {
    readback.start(step, make_step(step, masked));
    reference.start(step, make_step(step, masked));
    if (step % 3 == 2) {  // release in bursts, as copies land
      for (int64_t s = 0; s <= step; ++s) held.release(s);
    }
    readback.deliver_landed();
  }
  readback.drain();
  ASSERT_EQ(got.size(), static_cast<size_t>(n));
  for (int64_t step = 0; step < n; ++step) {
    const auto& r = got[step];
    EXPECT_EQ(r.step, step);
    const StepScalars s = make_step(step, masked);
    ASSERT_EQ(r.values.size(), s.size());
    ASSERT_EQ(blocking[step].values.size(), s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      EXPECT_EQ(r.values[i].first, s.entries()[i].key);
      EXPECT_TRUE(same_bits(r.values[i].second, blocking[step].values[i].second))
          << "step " << step << " key " << r.values[i].first;
      if (!s.entries()[i].finite_count.defined()) {
        // Unmasked on one rank: the step's own value, converted exactly.
        EXPECT_TRUE(same_bits(r.values[i].second, s.entries()[i].value.item<double>()));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Masking, StepReadbackTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Masked" : "Unmasked"; });

TEST(StepReadbackUnitTest, OneRankUnmaskedValueIsTheStepsOwnValue) {
  std::vector<StepRecord> got;
  StepReadback readback([&](const StepRecord& r) { got.push_back(r); });
  StepScalars s;
  const float value = 0.1234567f;
  s.add("loss", at::full({}, value));
  readback.start(0, s);
  readback.deliver_landed();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(same_bits(got[0].values[0].second, static_cast<double>(value)));
}

TEST(StepReadbackUnitTest, ZeroCountLogsNaNAndCountWeightsTheValue) {
  std::vector<StepRecord> got;
  StepReadback readback([&](const StepRecord& r) { got.push_back(r); });
  StepScalars s;
  s.add("loss", at::full({}, 2.0));
  s.add_counted("masked_none", at::full({}, 5.0), at::zeros({}, at::kLong));
  s.add_counted("masked_some", at::full({}, 0.75), at::full({}, 8, at::kLong));
  readback.start(3, s);
  readback.drain();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].values[0].second, 2.0);
  EXPECT_TRUE(std::isnan(got[0].values[1].second));
  EXPECT_EQ(got[0].values[2].second, 0.75);
}

TEST(StepReadbackUnitTest, LandedStepWaitsBehindAnEarlierUnlandedStep) {
  std::vector<int64_t> order;
  HeldSteps held;
  StepReadback::Options opts;
  opts.probe = held.probe();
  StepReadback readback([&](const StepRecord& r) { order.push_back(r.step); }, opts);
  for (int64_t step = 0; step < 4; ++step) readback.start(step, make_step(step, false));
  held.release(1);
  held.release(2);
  EXPECT_EQ(readback.deliver_landed(), 0u);  // step 0 holds the line
  EXPECT_TRUE(order.empty());
  held.release(0);
  EXPECT_EQ(readback.deliver_landed(), 3u);  // 0, 1, 2; 3 has not landed
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(readback.pending(), 1u);
  EXPECT_EQ(readback.drain(), 1u);
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(held.waited, (std::vector<int64_t>{3}));
  EXPECT_EQ(readback.drain(), 0u);  // nothing delivered twice
}

TEST(StepReadbackUnitTest, MaxInFlightBoundsTheDeliveryLagByWaitingForTheOldest) {
  std::vector<int64_t> order;
  HeldSteps held;
  StepReadback::Options opts;
  opts.probe = held.probe();
  opts.max_in_flight = 3;
  StepReadback readback([&](const StepRecord& r) { order.push_back(r.step); }, opts);
  for (int64_t step = 0; step < 8; ++step) {
    readback.start(step, make_step(step, false));
    // Nothing has landed by itself, yet every step <= step - 3 is delivered.
    EXPECT_EQ(readback.pending(), std::min<size_t>(step + 1, 3)) << "step " << step;
    EXPECT_EQ(order.size(), static_cast<size_t>(std::max<int64_t>(0, step - 2)));
  }
  EXPECT_EQ(held.waited, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  held.release(5);
  EXPECT_EQ(readback.deliver_landed(), 1u);  // a landed step still goes at once
  readback.drain();
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(StepReadbackUnitTest, ExceptionMidEpochDeliversOnlyLandedStepsInOrder) {
  std::vector<int64_t> order;
  HeldSteps held;
  StepReadback::Options opts;
  opts.probe = held.probe();
  StepReadback readback([&](const StepRecord& r) { order.push_back(r.step); }, opts);
  auto epoch = [&] {
    ReadbackScope scope(readback);
    for (int64_t step = 0; step < 10; ++step) {
      if (step == 6) throw std::runtime_error("out of memory at step 6");
      readback.start(step, make_step(step, true));
      readback.deliver_landed();
    }
    readback.drain();
  };
  held.release(0);
  held.release(1);
  held.release(3);  // 2 never lands, so 3 must not be delivered
  held.release(4);
  EXPECT_THROW(
      {
        try {
          epoch();
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "out of memory at step 6");
          throw;
        }
      },
      std::runtime_error);
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(held.waited.empty());  // the error path never waits
  EXPECT_EQ(readback.pending(), 0u);
}

TEST(StepReadbackUnitTest, NormalScopeExitLeavesDeliveryToTheCaller) {
  std::vector<int64_t> order;
  StepReadback readback([&](const StepRecord& r) { order.push_back(r.step); });
  {
    ReadbackScope scope(readback);
    readback.start(0, make_step(0, false));
  }
  EXPECT_TRUE(order.empty());
  EXPECT_EQ(readback.pending(), 1u);
  readback.drain();
  EXPECT_EQ(order, (std::vector<int64_t>{0}));
}

TEST(StepReadbackUnitTest, EachStepCarriesTheLearningRateInForceAtThatStep) {
  std::vector<StepRecord> got;
  HeldSteps held;
  StepReadback::Options opts;
  opts.probe = held.probe();
  StepReadback readback([&](const StepRecord& r) { got.push_back(r); }, opts);
  double lr = 1e-3;
  for (int64_t step = 0; step < 6; ++step) {
    readback.start(step, make_step(step, false), {{"lr", lr}, {"step_time_s", 0.01 * step}});
    lr *= 0.5;  // the schedule moves on before the step is delivered
  }
  readback.drain();
  ASSERT_EQ(got.size(), 6u);
  for (int64_t step = 0; step < 6; ++step) {
    ASSERT_EQ(got[step].host.size(), 2u);
    EXPECT_EQ(got[step].host[0].first, "lr");
    EXPECT_EQ(got[step].host[0].second, 1e-3 * std::pow(0.5, step));
    EXPECT_EQ(got[step].host[1].second, 0.01 * step);
  }
}

TEST(StepReadbackUnitTest, BlockingPolicyDeliversAtOnceAndNoneDeliversNothing) {
  std::vector<int64_t> order;
  StepReadback::Options blocking;
  blocking.policy = ReadbackPolicy::kBlocking;
  StepReadback a([&](const StepRecord& r) { order.push_back(r.step); }, blocking);
  a.start(7, make_step(7, true));
  EXPECT_EQ(order, (std::vector<int64_t>{7}));
  EXPECT_EQ(a.pending(), 0u);

  StepReadback::Options none;
  none.policy = ReadbackPolicy::kNone;
  StepReadback b([&](const StepRecord& r) { order.push_back(r.step); }, none);
  b.start(8, make_step(8, true));
  b.drain();
  EXPECT_EQ(order, (std::vector<int64_t>{7}));
  EXPECT_EQ(parse_readback_policy("blocking"), ReadbackPolicy::kBlocking);
  EXPECT_THROW(parse_readback_policy("sometimes"), c10::Error);
}

void expect_error_mentions(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an error";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
  }
}

TEST(StepReadbackUnitTest, BadInputNamesTheKeyAndStep) {
  StepReadback readback([](const StepRecord&) {});
  StepScalars not_scalar;
  not_scalar.add("loss", at::ones({2}));
  expect_error_mentions([&] { readback.start(5, not_scalar); }, {"step 5", "'loss'", "0-d"});

  StepReadback r2([](const StepRecord&) {});
  r2.start(0, make_step(0, false));
  StepScalars renamed = make_step(1, false);
  StepScalars other;
  for (const auto& e : renamed.entries())
    other.add(e.key == "loss/pressure" ? "loss/p" : e.key, e.value);
  expect_error_mentions([&] { r2.start(1, other); }, {"step 1", "'loss/p'", "'loss/pressure'"});

  StepReadback r3([](const StepRecord&) {});
  StepScalars negative;
  negative.add_counted("nut_l2", at::ones({}), at::full({}, -3, at::kLong));
  expect_error_mentions(
      [&] {
        r3.start(9, negative);
        r3.drain();
      },
      {"step 9", "'nut_l2'", "count"});

  StepReadback r4([](const StepRecord&) {});
  StepScalars inf;
  inf.add_counted("nut_l2", at::ones({}), at::full({}, INFINITY));
  expect_error_mentions(
      [&] {
        r4.start(2, inf);
        r4.drain();
      },
      {"step 2", "'nut_l2'", "count"});
}

}  // namespace
}  // namespace slipstream
