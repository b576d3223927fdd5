// Force and moment coefficients against closed forms on a UV sphere:
// uniform pressure on a closed surface gives nothing; uniform friction gives
// ±c·area/A_ref by the shear convention; potential flow gives no drag and no lift (d'Alembert); the
// front half sphere's pressure integrals; the moment about an offset centre;
// an orthonormal axis frame, also when `up` lies along the flow; R^2.
#include "aero/forces/force_coefficients.h"
#include "aero/geometry/surface_mesh.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

namespace slipstream::aero {
namespace {

struct Sphere {
  CellGeometry g;
  double radius;
};

Sphere sphere(double radius = 0.8, int64_t n_theta = 240) {
  return {cell_geometry(make_uv_sphere(radius, {0, 0, 0}, n_theta, 2 * n_theta)), radius};
}

double dot(const Vec3& a, const Vec3& b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }

TEST(ForceCoefficientsTest, UniformPressureOnAClosedSurfaceGivesNoForceAndNoMoment) {
  const auto s = sphere(0.8, 60);
  const int64_t c = s.g.areas.size(0);
  const auto cp = torch::full({c}, 0.7, torch::kDouble);
  const auto cf = torch::zeros({c, 3}, torch::kDouble);
  ForceOptions o;
  o.moment_center = {0.3, -0.2, 0.1};
  const auto r = force_coefficients(s.g.centroids, s.g.normals, s.g.areas, cp, cf, {1, 0.2, 0}, o);
  const double scale = 0.7 * s.g.areas.sum().item<double>();  // |pressure| x area
  for (const auto& name : coefficient_names()) {
    EXPECT_LE(std::abs(r.at(name)), 1e-10 * scale) << name << " = " << r.at(name);
  }
}

TEST(ForceCoefficientsTest, UniformFrictionGivesItsAreaOverTheReferenceAreaSignedByConvention) {
  const auto s = sphere(0.8, 40);
  const int64_t c = s.g.areas.size(0);
  auto cf = torch::zeros({c, 3}, torch::kDouble);
  cf.select(1, 0).fill_(0.004);
  ForceOptions o;
  o.reference_area = 2.5;
  const double magnitude = 0.004 * s.g.areas.sum().item<double>() / 2.5;
  const auto zero_cp = torch::zeros({c}, torch::kDouble);
  // The fluid's stress on the wall along the flow drags the body downstream.
  o.shear = ShearConvention::kFluidOnWall;
  auto r = force_coefficients(s.g.centroids, s.g.normals, s.g.areas, zero_cp, cf, {3, 0, 0}, o);
  EXPECT_NEAR(r.at("CD"), magnitude, 1e-15);
  EXPECT_NEAR(r.at("CL"), 0.0, 1e-15);
  EXPECT_NEAR(r.at("CS"), 0.0, 1e-15);
  // The wall's stress on the fluid (OpenFOAM's wallShearStress, the
  // default) along the flow is the body pushing the fluid: a thrust.
  EXPECT_EQ(ForceOptions{}.shear, ShearConvention::kWallOnFluid);
  o.shear = ShearConvention::kWallOnFluid;
  r = force_coefficients(s.g.centroids, s.g.normals, s.g.areas, zero_cp, cf, {3, 0, 0}, o);
  EXPECT_NEAR(r.at("CD"), -magnitude, 1e-15);
  r = force_coefficients(s.g.centroids, s.g.normals, s.g.areas, zero_cp, -cf, {3, 0, 0}, o);
  EXPECT_NEAR(r.at("CD"), magnitude, 1e-15);
}

TEST(ForceCoefficientsTest, ShearConventionsParseByNameAndOthersAreRefused) {
  for (auto c : {ShearConvention::kWallOnFluid, ShearConvention::kFluidOnWall}) {
    EXPECT_EQ(parse_shear_convention(to_string(c)), c);
  }
  try {
    parse_shear_convention("on_wall");
    FAIL() << "accepted 'on_wall'";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("wall_on_fluid"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fluid_on_wall"), std::string::npos) << msg;
  }
}

// Cp of potential flow past a sphere: 1 - 9/4 sin^2(theta), theta from the
// upstream stagnation point.
torch::Tensor potential_cp(const CellGeometry& g, const Vec3& dir) {
  const auto d = torch::tensor({dir[0], dir[1], dir[2]}, torch::kDouble);
  const auto cos_t = -(g.normals * d).sum(1);
  return 1.0 - 2.25 * (1.0 - cos_t * cos_t);
}

TEST(ForceCoefficientsTest, PotentialFlowPastASphereHasNoDragAndNoLift) {
  const auto s = sphere();
  const Vec3 dir{0.9, 0.3, 0.1};
  const double norm = std::sqrt(dot(dir, dir));
  const Vec3 unit{dir[0] / norm, dir[1] / norm, dir[2] / norm};
  ForceOptions o;
  o.reference_area = M_PI * s.radius * s.radius;
  const int64_t c = s.g.areas.size(0);
  const auto r = force_coefficients(s.g.centroids, s.g.normals, s.g.areas, potential_cp(s.g, unit),
                                    torch::zeros({c, 3}, torch::kDouble), dir, o);
  // d'Alembert: zero, up to the mesh's discretisation error.
  EXPECT_LT(std::abs(r.at("CD")), 1e-4) << r.at("CD");
  EXPECT_LT(std::abs(r.at("CL")), 1e-4) << r.at("CL");
  EXPECT_LT(std::abs(r.at("CS")), 1e-4) << r.at("CS");
}

TEST(ForceCoefficientsTest, TheFrontHalfSpheresPressureIntegralsMatchTheirClosedForms) {
  const auto s = sphere();
  const int64_t c = s.g.areas.size(0);
  // Flow along -z: the front half is z > 0, where the normal faces the flow.
  const Vec3 flow{0, 0, -1};
  const auto front = (s.g.centroids.select(1, 2) > 0).to(torch::kDouble);
  ForceOptions o;
  o.reference_area = M_PI * s.radius * s.radius;
  o.up_direction = {1, 0, 0};
  const auto zero_cf = torch::zeros({c, 3}, torch::kDouble);
  // Cp = 1 on the front half: the projected area, CD = 1.
  auto r = force_coefficients(s.g.centroids, s.g.normals, s.g.areas, front, zero_cf, flow, o);
  EXPECT_NEAR(r.at("CD"), 1.0, 2e-4);
  // Potential-flow Cp on the front half: int (1 - 9/4 sin^2) cos 2 pi sin = -1/8 of pi a^2.
  r = force_coefficients(s.g.centroids, s.g.normals, s.g.areas,
                         potential_cp(s.g, {0, 0, -1}) * front, zero_cf, flow, o);
  EXPECT_NEAR(r.at("CD"), -0.125, 2e-4);
  EXPECT_NEAR(r.at("CL"), 0.0, 1e-12);
}

TEST(ForceCoefficientsTest, AnOffsetMomentCentreGivesTheMomentOfTheForceAboutIt) {
  const auto s = sphere(0.8, 40);
  const int64_t c = s.g.areas.size(0);
  auto cf = torch::zeros({c, 3}, torch::kDouble);
  cf.select(1, 0).fill_(0.01);
  ForceOptions o;
  o.shear = ShearConvention::kFluidOnWall;  // F along +x
  o.reference_area = 2.0;
  o.reference_length = 1.5;
  o.moment_center = {0, 0, 0.4};
  const auto r = force_coefficients(s.g.centroids, s.g.normals, s.g.areas,
                                    torch::zeros({c}, torch::kDouble), cf, {1, 0, 0}, o);
  // F = 0.01 S x; M = -(0, 0, h) x F = -0.01 S h y; the side axis is z x x = y.
  const double area = s.g.areas.sum().item<double>();
  EXPECT_NEAR(r.at("CMP"), -0.01 * area * 0.4 / (2.0 * 1.5), 1e-12);
  EXPECT_NEAR(r.at("CMR"), 0.0, 1e-12);
  EXPECT_NEAR(r.at("CMY"), 0.0, 1e-12);
}

TEST(ForceCoefficientsTest, TheAxisFrameIsOrthonormalAlsoWhenUpLiesAlongTheFlow) {
  torch::manual_seed(5);
  std::vector<std::pair<Vec3, Vec3>> cases = {{{1, 0, 0}, {0, 0, 1}},
                                              {{0, 0, 2}, {0, 0, 1}},   // up along the flow
                                              {{0, 0, -3}, {0, 0, 1}},  // against it
                                              {{1, 1, 0}, {1, 1, 0}}};
  for (int i = 0; i < 20; ++i) {
    const auto r = torch::randn({6}, torch::kDouble);
    cases.push_back({{r[0].item<double>(), r[1].item<double>(), r[2].item<double>()},
                     {r[3].item<double>(), r[4].item<double>(), r[5].item<double>()}});
  }
  for (const auto& [flow, up] : cases) {
    const auto f = axis_frame(flow, up);
    for (const auto* v : {&f.drag, &f.lift, &f.side}) EXPECT_NEAR(dot(*v, *v), 1.0, 1e-12);
    EXPECT_NEAR(dot(f.drag, f.lift), 0.0, 1e-12);
    EXPECT_NEAR(dot(f.drag, f.side), 0.0, 1e-12);
    EXPECT_NEAR(dot(f.lift, f.side), 0.0, 1e-12);
    const double n = std::sqrt(dot(flow, flow));
    EXPECT_NEAR(dot(f.drag, flow), n, 1e-12);  // drag along the flow
  }
  const auto plain = axis_frame({1, 0, 0}, {0, 0, 1});
  EXPECT_NEAR(plain.lift[2], 1.0, 1e-15);
  EXPECT_NEAR(plain.side[1], 1.0, 1e-15);  // z x x = y
}

TEST(ForceCoefficientsTest, SummaryGivesMeansMaeAndRSquared) {
  std::vector<std::map<std::string, double>> pred, truth;
  for (double t : {0.30, 0.32, 0.28, 0.35}) {
    std::map<std::string, double> p, q;
    for (const auto& name : coefficient_names()) {
      q[name] = t;
      p[name] = t + 0.01;
    }
    pred.push_back(p);
    truth.push_back(q);
  }
  const auto s = summarize_coefficients(pred, truth).at("CD");
  EXPECT_NEAR(s.true_mean, 0.3125, 1e-12);
  EXPECT_NEAR(s.pred_mean, 0.3225, 1e-12);
  EXPECT_NEAR(s.mae, 0.01, 1e-12);
  // sum (truth - mean)^2 = 0.002675, residual 4e-4: R^2 = 1 - 0.0004 / 0.002675.
  EXPECT_NEAR(s.r2, 1.0 - 0.0004 / 0.002675, 1e-9);
  // A coefficient some samples lack is left out; no spread: R^2 undefined.
  pred[1].erase("CMY");
  for (auto& t : truth) t["CL"] = 0.125;
  for (size_t i = 0; i < truth.size(); ++i) truth[i]["CS"] = 1e-8 * static_cast<double>(i);
  const auto partial = summarize_coefficients(pred, truth);
  EXPECT_EQ(partial.count("CMY"), 0u);
  EXPECT_TRUE(std::isnan(partial.at("CL").r2));
  EXPECT_TRUE(std::isnan(partial.at("CS").r2));  // varies by round-off only
}

}  // namespace
}  // namespace slipstream::aero
