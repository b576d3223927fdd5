// The field schema: channel layout, non-dimensionalisation and z-score
// normalisation that invert exactly, JSON round trip, errors that name the
// field, and its resolution from a config (the recipe's `targets:` form).
#include "aero/fields/field_schema.h"
#include "aero/run/train_settings.h"
#include "support/recipe_support.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

namespace slipstream::aero {
namespace {

using testing::error_message_of;

TEST(FieldSchemaTest, ChannelOffsetsFollowTheDeclaredOrder) {
  FieldSchema s({{"pressure", FieldType::kScalar, Nondim::kPressure, {}, 1.0, 1.0},
                 {"wss", FieldType::kVector, Nondim::kStress, {}, 0.00313, 1.0},
                 {"nut", FieldType::kScalar, Nondim::kIdentity, {}, 1.0, 1.0}});
  EXPECT_EQ(s.total_channels(), 5);
  EXPECT_EQ(s.offset(0), 0);
  EXPECT_EQ(s.offset(1), 1);
  EXPECT_EQ(s.offset(2), 4);
  EXPECT_EQ(s.find("wss")->channels(), 3);
  EXPECT_EQ(s.find("velocity"), nullptr);
  EXPECT_EQ(s.names(), (std::vector<std::string>{"pressure", "wss", "nut"}));
}

TEST(FieldSchemaTest, EachNondimensionalisationMatchesItsFormulaAndInverts) {
  const FreeStream fs{38.89, 1.225, 101.3};
  const double q = 0.5 * 1.225 * 38.89 * 38.89;
  FieldSchema s({{"velocity", FieldType::kVector, Nondim::kVelocity, {0.1, 0.0, 0.0}, 0.5, 1.0},
                 {"pressure", FieldType::kScalar, Nondim::kPressure, {}, 1.0, 1.0},
                 {"wss", FieldType::kVector, Nondim::kStress, {}, 0.00313, 1.0},
                 {"nut", FieldType::kScalar, Nondim::kIdentity, {4.8e-4}, 9.4e-4, 1.0}});
  torch::manual_seed(1);
  const auto u = torch::randn({20, 3}, torch::kDouble) * 40;
  const auto p = torch::randn({20, 1}, torch::kDouble) * 500;
  const auto tau = torch::randn({20, 3}, torch::kDouble) * 3;
  const auto nut = torch::rand({20, 1}, torch::kDouble) * 1e-3;
  const auto& f = s.fields();
  const auto mean_u = torch::tensor({0.1, 0.0, 0.0}, torch::kDouble).view({1, 3});
  EXPECT_TRUE(torch::allclose(s.to_model(f[0], u, fs), (u / 38.89 - mean_u) / 0.5));
  EXPECT_TRUE(torch::allclose(s.to_model(f[1], p, fs), (p - 101.3) / q));
  EXPECT_TRUE(torch::allclose(s.to_model(f[2], tau, fs), tau / q / 0.00313));
  EXPECT_TRUE(torch::allclose(s.to_model(f[3], nut, fs), (nut - 4.8e-4) / 9.4e-4));
  int i = 0;
  for (const auto& x : {u, p, tau, nut}) {
    EXPECT_TRUE(torch::allclose(s.to_physical(f[i], s.to_model(f[i], x, fs), fs), x, 1e-12, 1e-9))
        << f[i].name;
    ++i;
  }
}

TEST(FieldSchemaTest, JsonRoundTripAndBadFieldsNameTheField) {
  FieldSchema s({{"pressure", FieldType::kScalar, Nondim::kPressure, {}, 1.0, 2.0},
                 {"wss", FieldType::kVector, Nondim::kStress, {0.0}, 0.00313, 1.0}});
  EXPECT_EQ(FieldSchema::from_json(s.to_json()), s);
  EXPECT_EQ(s.find("wss")->mean,
            (std::vector<double>{0.0, 0.0, 0.0}));  // one mean, every component
  auto msg = error_message_of([] {
    FieldSchema({{"nut", FieldType::kScalar, Nondim::kIdentity, {}, 0.0, 1.0}});
  });
  EXPECT_NE(msg.find("'nut'"), std::string::npos) << msg;
  msg = error_message_of([] {
    FieldSchema({{"wss", FieldType::kVector, Nondim::kStress, {0.0, 1.0}, 1.0, 1.0}});
  });
  EXPECT_NE(msg.find("'wss'"), std::string::npos) << msg;
  msg = error_message_of([] {
    FieldSchema({{"p", FieldType::kScalar, Nondim::kIdentity, {}, 1.0, 1.0},
                 {"p", FieldType::kScalar, Nondim::kIdentity, {}, 1.0, 1.0}});
  });
  EXPECT_NE(msg.find("twice"), std::string::npos) << msg;
  EXPECT_NE(error_message_of([] { parse_nondim("speed"); }).find("speed"), std::string::npos);
}

TEST(FieldSchemaTest, ResolvedFromTheDatasetConfigWithWeightsAndStats) {
  const auto c = testing::load_config(
      {"dataset.normalization.nut.std=0.25", "loss.field_weights={pressure: 2.0}"});
  const FieldSchema s = resolve_fields(c);
  EXPECT_EQ(s.names(), (std::vector<std::string>{"velocity", "pressure", "nut"}));
  EXPECT_EQ(s.find("velocity")->type, FieldType::kVector);
  EXPECT_EQ(s.find("velocity")->nondim, Nondim::kVelocity);
  EXPECT_EQ(s.find("pressure")->nondim, Nondim::kPressure);
  EXPECT_DOUBLE_EQ(s.find("pressure")->loss_weight, 2.0);
  EXPECT_DOUBLE_EQ(s.find("nut")->std_dev, 0.25);
  // A weight or a statistic for a field that is not a target names it.
  auto msg = error_message_of(
      [] { resolve_fields(testing::load_config({"loss.field_weights={wss: 1.0}"})); });
  EXPECT_NE(msg.find("loss.field_weights.wss"), std::string::npos) << msg;
  EXPECT_NE(msg.find("velocity, pressure, nut"), std::string::npos) << msg;
  msg = error_message_of(
      [] { resolve_fields(testing::load_config({"dataset.targets.pressure=tensor"})); });
  EXPECT_NE(msg.find("dataset.targets.pressure"), std::string::npos) << msg;
}

}  // namespace
}  // namespace slipstream::aero
