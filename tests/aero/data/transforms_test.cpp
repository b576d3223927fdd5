// The recipe's transforms: non-dimensionalization undone by
// denormalize_targets, centring, and rotation augmentation that turns
// points, normals, velocity and U_inf together.
#include "aero/data/loader.h"
#include "aero/data/synthetic.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

namespace slipstream::aero {
namespace {

Sample sample() {
  SyntheticOptions o;
  o.points_per_sample = 400;
  Sample s = make_synthetic_sample(5, o);
  s.rho_inf = 1.2;
  s.p_inf = 101325.0 * 1e-5;
  s.u_inf = s.u_inf * 30;  // dimensional: 30 m/s scale
  s.targets["velocity"] = s.targets["velocity"] * 30;
  return s;
}

TEST(TransformsTest, NondimensionalizeAndNormalizeNutRoundTrip) {
  const Sample s = sample();
  LoaderOptions o;
  o.sampling_resolution = 0;
  o.transforms.nondimensionalize = true;
  o.transforms.nut_mean = 0.01;
  o.transforms.nut_std = 0.05;
  const Batch b = make_host_batch(s, o, 1);
  const double speed = s.u_inf.norm().item<double>();
  auto v = b.target[0].narrow(1, 0, 3);
  EXPECT_TRUE(torch::allclose(v, s.targets.at("velocity") / speed, 1e-5, 1e-6));
  const double q = 0.5 * 1.2 * speed * speed;
  EXPECT_TRUE(torch::allclose(b.target[0].narrow(1, 3, 1), (s.targets.at("pressure") - s.p_inf) / q,
                              1e-4, 1e-6));
  auto back = denormalize_targets(b.target[0], s, o);
  EXPECT_TRUE(torch::allclose(back.narrow(1, 0, 3), s.targets.at("velocity"), 1e-5, 1e-4));
  EXPECT_TRUE(torch::allclose(back.narrow(1, 3, 1), s.targets.at("pressure"), 1e-4, 1e-3));
  EXPECT_TRUE(torch::allclose(back.narrow(1, 4, 1), s.targets.at("nut"), 1e-5, 1e-6));
}

TEST(TransformsTest, CenterAndBlockSubsample) {
  const Sample s = sample();
  LoaderOptions o;
  o.sampling_resolution = 50;
  o.transforms.center = true;
  o.transforms.subsample = "block";
  const Batch b = make_host_batch(s, o, 3);
  auto pts = b.embedding[0].narrow(1, 0, 3);
  const auto mean = s.points.mean(0);
  // A contiguous run of the sample's points, shifted by its mean.
  auto first = (s.points - (pts[0] + mean)).abs().sum(1).argmin().item<int64_t>();
  EXPECT_TRUE(torch::allclose(pts + mean, s.points.narrow(0, first, 50), 1e-5, 1e-5));
}

TEST(TransformsTest, RotationTurnsPointsNormalsVelocityAndFreeStreamTogether) {
  const Sample s = sample();
  LoaderOptions o;
  o.sampling_resolution = 0;
  o.augment = true;
  o.transforms.rotate_z_max_deg = 30;
  const Batch plain = [&] {
    LoaderOptions p = o;
    p.augment = false;
    return make_host_batch(s, p, 9);
  }();
  const Batch b = make_host_batch(s, o, 9);
  // Distances are kept, the SDF is unchanged, and the flow turns with the body.
  EXPECT_TRUE(torch::allclose(b.embedding[0].narrow(1, 0, 3).norm(2, 1),
                              plain.embedding[0].narrow(1, 0, 3).norm(2, 1), 1e-5, 1e-5));
  EXPECT_TRUE(torch::equal(b.embedding[0].narrow(1, 3, 1), plain.embedding[0].narrow(1, 3, 1)));
  EXPECT_FALSE(torch::allclose(b.fx, plain.fx));
  // U_inf . velocity is invariant under a common rotation.
  auto dots = [](const Batch& x) {
    return (x.fx[0] * x.target[0].narrow(1, 0, 3)).sum(1);
  };
  EXPECT_TRUE(torch::allclose(dots(b), dots(plain), 1e-4, 1e-3));
  EXPECT_TRUE(torch::allclose(rotate_z(torch::tensor({{1.0, 0.0, 0.5}}), M_PI / 2),
                              torch::tensor({{0.0, 1.0, 0.5}}), 1e-6, 1e-6));
}

}  // namespace
}  // namespace slipstream::aero
