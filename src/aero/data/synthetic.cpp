#include "aero/data/synthetic.h"

#include "aero/geometry/surface_mesh.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>

namespace slipstream::aero {

namespace {
constexpr double kHalfBox = 4.0;    // the domain is [-4, 4]^3
constexpr double kWallScale = 0.5;  // mean distance of the graded points from the wall, in radii
constexpr double kSurfaceViscosity = 1e-5;  // nu of the surface samples' skin friction

// Sample i's sphere and free stream, drawn from its own generator (which the
// volume sample goes on drawing its points from).
struct SphereFlow {
  at::Generator gen;
  double radius, speed;
  torch::Tensor center, u_inf;  // (3) float64

  SphereFlow(int64_t index, uint64_t seed)
      : gen(at::detail::createCPUGenerator(seed * 1000003ULL + static_cast<uint64_t>(index))) {
    auto uniform = [&](double lo, double hi) {
      return torch::empty({1}, torch::kDouble).uniform_(lo, hi, gen).item<double>();
    };
    radius = uniform(0.5, 1.0);
    center = torch::empty({3}, torch::kDouble).uniform_(-0.3, 0.3, gen);
    speed = uniform(0.6, 1.4);
    const double yaw = uniform(-M_PI / 6, M_PI / 6), pitch = uniform(-M_PI / 18, M_PI / 18);
    u_inf = torch::tensor({speed * std::cos(pitch) * std::cos(yaw),
                           speed * std::cos(pitch) * std::sin(yaw), speed * std::sin(pitch)},
                          torch::kDouble);
  }
};
}  // namespace

SampleLayout synthetic_layout(const std::string& kind) {
  SampleLayout l;
  if (kind == "surface") {
    l.point_channels = {{"points", 3}, {"normals", 3}, {"area", 1}, {"pressure", 1}, {"wss", 3}};
    l.global_sizes = {{"U_inf", 3}, {"rho_inf", 1}, {"p_inf", 1}, {"L_ref", 1}, {"A_ref", 1}};
    return l;
  }
  l.point_channels = {{"points", 3},   {"sdf", 1},      {"sdf_normals", 3}, {"volume", 1},
                      {"velocity", 3}, {"pressure", 1}, {"nut", 1}};
  l.global_sizes = {{"U_inf", 3}, {"rho_inf", 1}, {"p_inf", 1}, {"L_ref", 1}};
  return l;
}

torch::Tensor sphere_potential_flow_velocity(const torch::Tensor& offsets, double radius,
                                             const torch::Tensor& u_inf) {
  auto r = offsets.norm(2, 1, true);  // (N,1)
  auto u_dot_r = (offsets * u_inf.view({1, 3})).sum(1, true);
  const double a3 = radius * radius * radius;
  return u_inf.view({1, 3}) * (1.0 + a3 / (2.0 * r.pow(3))) -
         1.5 * a3 * u_dot_r * offsets / r.pow(5);
}

Sample make_synthetic_sample(int64_t index, const SyntheticOptions& o, SyntheticSphere* body) {
  TORCH_CHECK(o.points_per_sample > 0, "synthetic: points_per_sample must be > 0");
  TORCH_CHECK(o.kind == "volume" || o.kind == "surface", "synthetic: kind '", o.kind,
              "' is not one of volume, surface");
  if (o.kind == "surface") {
    TORCH_CHECK(body == nullptr, "synthetic: a surface sample has no separate body");
    return make_synthetic_surface_sample(index, o);
  }
  SphereFlow flow(index, o.seed);
  auto& gen = flow.gen;
  const double a = flow.radius, speed = flow.speed;
  const auto& center = flow.center;
  const auto& u_inf = flow.u_inf;
  // Half the points uniform in the box outside the sphere, half graded
  // towards the wall as a CFD mesh is: r = a (1 + t), t ~ Exp(mean kWallScale).
  const int64_t n = o.points_per_sample;
  const int64_t n_wall = n / 2;
  auto inside_box = [](const torch::Tensor& x) { return (x.abs() < kHalfBox).all(1); };
  std::vector<torch::Tensor> kept;
  int64_t have = 0;
  while (have < n - n_wall) {
    auto cand = torch::empty({n + 16, 3}, torch::kDouble).uniform_(-kHalfBox, kHalfBox, gen);
    auto sel = cand.index({(cand - center.view({1, 3})).norm(2, 1) > a * 1.001});
    kept.push_back(sel);
    have += sel.size(0);
  }
  std::vector<torch::Tensor> near;
  int64_t have_near = 0;
  while (have_near < n_wall) {
    auto dirs = torch::randn({n_wall + 16, 3}, gen, torch::kDouble);
    dirs = dirs / dirs.norm(2, 1, true);
    auto t = torch::empty({n_wall + 16, 1}, torch::kDouble).exponential_(1.0 / kWallScale, gen);
    auto cand = center.view({1, 3}) + dirs * (a * (1.001 + t));
    auto sel = cand.index({inside_box(cand)});
    near.push_back(sel);
    have_near += sel.size(0);
  }
  auto points =
      torch::cat({torch::cat(kept).narrow(0, 0, n - n_wall), torch::cat(near).narrow(0, 0, n_wall)})
          .contiguous();
  auto r_vec = points - center.view({1, 3});
  auto r = r_vec.norm(2, 1, true);
  // Cell volumes: 1 / (N * the sampling density) at each point.
  const double free_volume = std::pow(2 * kHalfBox, 3) - 4.0 / 3.0 * M_PI * a * a * a;
  auto t_wall = (r / a - 1.001).clamp_min(0.0);
  auto wall_density = torch::exp(-t_wall / kWallScale) / (kWallScale * a) / (4 * M_PI * r * r);
  auto density = (static_cast<double>(n - n_wall) / free_volume + n_wall * wall_density);
  auto volume = (1.0 / density).to(torch::kFloat);
  auto velocity = sphere_potential_flow_velocity(r_vec, a, u_inf);
  auto pressure = 0.5 * (u_inf.pow(2).sum() - velocity.pow(2).sum(1, true));
  // Wake: s along the stream, d across it.
  auto dir = u_inf / speed;
  auto s = (r_vec * dir.view({1, 3})).sum(1, true);
  auto d = (r_vec - s * dir.view({1, 3})).norm(2, 1, true);
  auto width = a * (1.0 + 0.25 * torch::relu(s) / a);
  auto nut = 0.1 * speed * a * torch::sigmoid(4.0 * s / a) * torch::exp(-(d / width).pow(2)) *
             torch::exp(-torch::relu(s) / (8.0 * a));

  if (body != nullptr) {
    body->radius = a;
    for (int k = 0; k < 3; ++k) body->center[k] = center[k].item<double>();
  }
  Sample out;
  out.id = "synthetic:" + std::to_string(index);
  out.point_data["points"] = points.to(torch::kFloat);
  out.point_data["sdf"] = (r - a).to(torch::kFloat);
  out.point_data["sdf_normals"] = (r_vec / r).to(torch::kFloat);
  out.point_data["volume"] = volume;
  out.point_data["velocity"] = velocity.to(torch::kFloat);
  out.point_data["pressure"] = pressure.to(torch::kFloat);
  out.point_data["nut"] = nut.to(torch::kFloat);
  out.global_data["U_inf"] = u_inf.to(torch::kFloat);
  out.global_data["rho_inf"] = torch::tensor({1.0}, torch::kDouble);
  out.global_data["p_inf"] = torch::tensor({0.0}, torch::kDouble);
  out.global_data["L_ref"] = torch::tensor({2.0 * a}, torch::kDouble);
  return out;
}

Sample make_synthetic_surface_sample(int64_t index, const SyntheticOptions& o) {
  SphereFlow flow(index, o.seed);
  const double a = flow.radius;
  const int64_t n_theta = std::max<int64_t>(4, std::llround(std::sqrt(o.points_per_sample / 2.0)));
  const std::array<double, 3> c{flow.center[0].item<double>(), flow.center[1].item<double>(),
                                flow.center[2].item<double>()};
  const SurfaceMesh mesh = make_uv_sphere(a, c, n_theta, 2 * n_theta);
  const CellGeometry g = cell_geometry(mesh);
  const auto dir = (flow.u_inf / flow.speed).view({1, 3});
  // theta from the upstream stagnation point, where the normal faces the flow.
  const auto cos_t = -(g.normals * dir).sum(1, true);
  const auto sin2 = (1.0 - cos_t * cos_t).clamp_min(0.0);
  const double q = 0.5 * flow.speed * flow.speed;  // rho 1
  const auto cp = 1.0 - 2.25 * sin2;
  // Along the surface flow: the free stream's tangential part.
  auto tangent = dir - (dir * g.normals).sum(1, true) * g.normals;
  tangent = tangent / tangent.norm(2, 1, true).clamp_min(1e-12);
  // Its level falls with the Reynolds number as a turbulent boundary
  // layer's does (0.0592 Re^-0.2), so that drag differs between samples.
  const double reynolds = flow.speed * 2.0 * a / kSurfaceViscosity;
  const auto cf = 0.0592 * std::pow(reynolds, -0.2) * sin2.sqrt() * (1.25 + 0.75 * cos_t);
  Sample s;
  s.id = "synthetic-surface:" + std::to_string(index);
  s.point_data["points"] = g.centroids.to(torch::kFloat);
  s.point_data["normals"] = g.normals.to(torch::kFloat);
  s.point_data["area"] = g.areas.to(torch::kFloat);
  s.point_data["pressure"] = (q * cp).to(torch::kFloat);
  // Stored as the wall's stress on the fluid, as OpenFOAM and DrivAerML
  // store it: against the surface flow (dataset.shear_stress: wall_on_fluid).
  s.point_data["wss"] = (-q * cf * tangent).to(torch::kFloat);
  s.global_data["U_inf"] = flow.u_inf.to(torch::kFloat);
  s.global_data["rho_inf"] = torch::tensor({1.0}, torch::kDouble);
  s.global_data["p_inf"] = torch::tensor({0.0}, torch::kDouble);
  s.global_data["L_ref"] = torch::tensor({2.0 * a}, torch::kDouble);
  s.global_data["A_ref"] = torch::tensor({M_PI * a * a}, torch::kDouble);
  s.mesh["vertices"] = mesh.vertices.to(torch::kFloat);
  s.mesh["offsets"] = mesh.offsets;
  s.mesh["connectivity"] = mesh.connectivity;
  return s;
}

}  // namespace slipstream::aero
