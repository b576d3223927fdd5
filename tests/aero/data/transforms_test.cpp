// The recipe's transforms in the loader: per-field non-dimensionalisation and
// normalisation undone by denormalize_targets, centring, block subsampling,
// and rotation augmentation that turns the points, every vector field and
// U_inf together.
#include "aero/data/loader.h"
#include "aero/data/synthetic.h"
#include "support/recipe_support.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

namespace slipstream::aero {
namespace {

// A dimensional sample: 30 m/s scale, rho 1.2, p_inf 1.01325.
Sample sample() {
  Sample s = testing::synthetic_sample(5, 400);
  s.global_data["rho_inf"] = torch::tensor({1.2}, torch::kDouble);
  s.global_data["p_inf"] = torch::tensor({101325.0 * 1e-5}, torch::kDouble);
  s.global_data["U_inf"] = s.global("U_inf") * 30;
  s.point_data["velocity"] = s.point("velocity") * 30;
  return s;
}

LoaderOptions options() {
  LoaderOptions o;
  o.inputs = testing::volume_inputs();
  o.sampling_resolution = 0;
  return o;
}

FieldSchema nondim_fields() {
  return FieldSchema({{"velocity", FieldType::kVector, Nondim::kVelocity, {}, 1.0, 1.0},
                      {"pressure", FieldType::kScalar, Nondim::kPressure, {}, 1.0, 1.0},
                      {"nut", FieldType::kScalar, Nondim::kIdentity, {0.01}, 0.05, 1.0}});
}

TEST(TransformsTest, NondimensionalizeAndNormalizeRoundTrip) {
  const Sample s = sample();
  LoaderOptions o = options();
  o.fields = nondim_fields();
  const Batch b = make_host_batch(s, o, 1);
  const double speed = s.global("U_inf").norm().item<double>();
  auto v = b.target[0].narrow(1, 0, 3);
  EXPECT_TRUE(torch::allclose(v, s.point("velocity") / speed, 1e-5, 1e-6));
  const double q = 0.5 * 1.2 * speed * speed;
  EXPECT_TRUE(torch::allclose(b.target[0].narrow(1, 3, 1), (s.point("pressure") - 1.01325) / q,
                              1e-4, 1e-6));
  EXPECT_TRUE(
      torch::allclose(b.target[0].narrow(1, 4, 1), (s.point("nut") - 0.01) / 0.05, 1e-5, 1e-5));
  auto back = denormalize_targets(b.target[0], s, o.fields);
  EXPECT_TRUE(torch::allclose(back.narrow(1, 0, 3), s.point("velocity"), 1e-5, 1e-4));
  EXPECT_TRUE(torch::allclose(back.narrow(1, 3, 1), s.point("pressure"), 1e-4, 1e-3));
  EXPECT_TRUE(torch::allclose(back.narrow(1, 4, 1), s.point("nut"), 1e-5, 1e-6));
}

// loss.forces: a batch carries the weights of its cells, scaled from the
// kept cells to the sample's; a block read from a file, which does not say
// how many cells the whole has, and a sample with no surface are refused.
TEST(TransformsTest, ForceWeightsScaleASubsampleToTheWholeSurface) {
  SyntheticOptions so;
  so.kind = "surface";
  so.points_per_sample = 800;
  const Sample s = make_synthetic_surface_sample(0, so);
  LoaderOptions o;
  o.inputs = InputSpec({{"embedding", {{"points", "normals"}, ""}}});
  o.fields = testing::surface_field_schema();
  o.force_loss = ForceLossFrame{};
  o.sampling_resolution = 0;
  const Batch whole = make_host_batch(s, o, 1);
  const int64_t n = s.num_points();
  ASSERT_EQ(whole.force_weights.sizes(), (std::vector<int64_t>{1, n, 4, 2}));
  // A quarter of the cells: each weighs four times as much.
  o.sampling_resolution = n / 4;
  const Batch quarter = make_host_batch(s, o, 1);
  EXPECT_NEAR(quarter.force_weights.abs().sum().item<double>() /
                  whole.force_weights.abs().sum().item<double>(),
              1.0, 0.2);
  Sample block = s;
  block.rows = torch::arange(n, torch::kLong);
  o.sampling_resolution = 0;
  const auto msg = testing::error_message_of([&] { make_host_batch(block, o, 1); });
  EXPECT_NE(msg.find("dataset.sampling_resolution"), std::string::npos) << msg;
  LoaderOptions vo = options();
  vo.force_loss = ForceLossFrame{};
  EXPECT_THROW(make_host_batch(testing::synthetic_sample(0, 100), vo, 1), c10::Error);
}

TEST(TransformsTest, CenterAndBlockSubsample) {
  const Sample s = sample();
  LoaderOptions o = options();
  o.sampling_resolution = 50;
  o.transforms.center = true;
  o.transforms.subsample = "block";
  const Batch b = make_host_batch(s, o, 3);
  auto pts = b.inputs.at("embedding")[0].narrow(1, 0, 3);
  const auto& points = s.point("points");
  const auto mean = points.mean(0);
  // A contiguous run of the sample's points, shifted by its mean.
  auto first = (points - (pts[0] + mean)).abs().sum(1).argmin().item<int64_t>();
  EXPECT_TRUE(torch::allclose(pts + mean, points.narrow(0, first, 50), 1e-5, 1e-5));
}

TEST(TransformsTest, RotationTurnsPointsNormalsEveryVectorFieldAndFreeStreamTogether) {
  Sample s = sample();
  // A second vector target: it must turn with the rest.
  s.point_data["wss"] = s.point("velocity") * 0.01;
  LoaderOptions o = options();
  o.fields = FieldSchema({{"velocity", FieldType::kVector, Nondim::kVelocity, {}, 1.0, 1.0},
                          {"pressure", FieldType::kScalar, Nondim::kPressure, {}, 1.0, 1.0},
                          {"wss", FieldType::kVector, Nondim::kStress, {}, 0.00313, 1.0}});
  o.augment = true;
  o.transforms.rotate_z_max_deg = 30;
  o.transforms.translate_max = 0.5;
  const Batch plain = [&] {
    LoaderOptions p = o;
    p.augment = false;
    return make_host_batch(s, p, 9);
  }();
  const Batch b = make_host_batch(s, o, 9);
  const auto& emb = b.inputs.at("embedding")[0];
  const auto& emb0 = plain.inputs.at("embedding")[0];
  // The SDF is unchanged; normals keep their length; the shift is in x and y.
  EXPECT_TRUE(torch::equal(emb.narrow(1, 3, 1), emb0.narrow(1, 3, 1)));
  EXPECT_TRUE(
      torch::allclose(emb.narrow(1, 4, 3).norm(2, 1), emb0.narrow(1, 4, 3).norm(2, 1), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(emb.select(1, 2), emb0.select(1, 2), 1e-6, 1e-6));  // z kept
  EXPECT_FALSE(torch::allclose(b.inputs.at("fx"), plain.inputs.at("fx")));
  // U_inf . u, U_inf . wss and normal . u are invariant under a common rotation.
  auto dot = [](const torch::Tensor& a, const torch::Tensor& c) { return (a * c).sum(1); };
  for (int64_t c0 : {0, 4}) {
    EXPECT_TRUE(torch::allclose(dot(b.inputs.at("fx")[0], b.target[0].narrow(1, c0, 3)),
                                dot(plain.inputs.at("fx")[0], plain.target[0].narrow(1, c0, 3)),
                                1e-4, 1e-3))
        << "channels " << c0;
  }
  EXPECT_TRUE(torch::allclose(dot(emb.narrow(1, 4, 3), b.target[0].narrow(1, 0, 3)),
                              dot(emb0.narrow(1, 4, 3), plain.target[0].narrow(1, 0, 3)), 1e-4,
                              1e-4));
  EXPECT_TRUE(torch::allclose(rotate_z(torch::tensor({{1.0, 0.0, 0.5}}), M_PI / 2),
                              torch::tensor({{0.0, 1.0, 0.5}}), 1e-6, 1e-6));
}

}  // namespace
}  // namespace slipstream::aero
