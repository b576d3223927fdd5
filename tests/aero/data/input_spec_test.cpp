// Model inputs from a sample's named tensors (the recipe's forward_kwargs):
// concatenated point fields, a global broadcast to every point, a global
// alone; widths from a layout; and errors that name the input and tensor.
#include "aero/data/input_spec.h"
#include "support/recipe_support.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

namespace slipstream::aero {
namespace {

using testing::error_message_of;

InputSpec parse(const std::string& yaml) {
  return InputSpec::from_yaml(YAML::Load(yaml), "model.inputs");
}

TEST(InputSpecTest, VolumeAndGeometryInputsHaveTheirShapesAndWidths) {
  const InputSpec spec = parse(
      "{local_embedding: [points, sdf, sdf_normals], geometry: points,"
      " fx: {source: U_inf, expand_like: local_embedding}, global_embedding: U_inf}");
  const Sample s = testing::synthetic_sample(0, 50);
  const auto widths = spec.widths(layout_of(s));
  EXPECT_EQ(widths.at("local_embedding"), 7);
  EXPECT_EQ(widths.at("geometry"), 3);
  EXPECT_EQ(widths.at("fx"), 3);
  EXPECT_EQ(widths.at("global_embedding"), 3);
  const auto req = spec.required(layout_of(s));
  EXPECT_EQ(req.point_channels.size(), 3u);  // points, sdf, sdf_normals: not the targets
  EXPECT_EQ(req.global_sizes.at("U_inf"), 3);

  const auto in = spec.assemble(s.point_data, s.global_data);
  EXPECT_EQ(in.at("local_embedding").sizes(), (std::vector<int64_t>{1, 50, 7}));
  EXPECT_TRUE(torch::equal(in.at("local_embedding")[0].narrow(1, 3, 1), s.point("sdf")));
  EXPECT_TRUE(torch::equal(in.at("geometry")[0], s.point("points")));
  EXPECT_EQ(in.at("fx").sizes(), (std::vector<int64_t>{1, 50, 3}));
  EXPECT_TRUE(torch::equal(in.at("fx")[0][49], s.global("U_inf")));
  EXPECT_EQ(in.at("global_embedding").sizes(), (std::vector<int64_t>{1, 1, 3}));
  EXPECT_TRUE(in.at("fx").is_contiguous());
  // The same sources make one tensor.
  const InputSpec twice = parse("{geometry: points, local_positions: points}");
  const auto both = twice.assemble(s.point_data, s.global_data);
  EXPECT_TRUE(both.at("geometry").is_same(both.at("local_positions")));
}

TEST(InputSpecTest, BadSpecsAndMissingTensorsNameTheInput) {
  const Sample s = testing::synthetic_sample(0, 20);
  auto msg =
      error_message_of([&] { parse("{embedding: [points, normals]}").widths(layout_of(s)); });
  EXPECT_NE(msg.find("'embedding'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'normals'"), std::string::npos) << msg;
  msg = error_message_of([] { parse("{fx: {source: U_inf, expand_like: embedding}}"); });
  EXPECT_NE(msg.find("'fx'"), std::string::npos) << msg;
  msg = error_message_of([] { parse("{fx: {source: U_inf, like: x}}"); });
  EXPECT_NE(msg.find("model.inputs.fx.like"), std::string::npos) << msg;
  msg = error_message_of([] { InputSpec::from_yaml(YAML::Node(), "model.inputs"); });
  EXPECT_NE(msg.find("model.inputs"), std::string::npos) << msg;
}

}  // namespace
}  // namespace slipstream::aero
