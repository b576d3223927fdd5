#include "aero/data/synthetic.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>

namespace slipstream::aero {

torch::Tensor sphere_potential_flow_velocity(const torch::Tensor& r_vec, double a,
                                             const torch::Tensor& u_inf) {
  auto r = r_vec.norm(2, 1, true);                   // (N,1)
  auto u_dot_r = (r_vec * u_inf.view({1, 3})).sum(1, true);
  const double a3 = a * a * a;
  return u_inf.view({1, 3}) * (1.0 + a3 / (2.0 * r.pow(3))) -
         1.5 * a3 * u_dot_r * r_vec / r.pow(5);
}

Sample make_synthetic_sample(int64_t index, const SyntheticOptions& o, SyntheticSphere* body) {
  TORCH_CHECK(o.points_per_sample > 0, "synthetic: points_per_sample must be > 0");
  auto gen = at::detail::createCPUGenerator(o.seed * 1000003ULL + static_cast<uint64_t>(index));
  auto uniform = [&](double lo, double hi) {
    return torch::empty({1}, torch::kDouble).uniform_(lo, hi, gen).item<double>();
  };
  const double a = uniform(0.5, 1.0);
  auto center = torch::empty({3}, torch::kDouble).uniform_(-0.3, 0.3, gen);
  const double speed = uniform(0.6, 1.4);
  const double yaw = uniform(-M_PI / 6, M_PI / 6), pitch = uniform(-M_PI / 18, M_PI / 18);
  auto u_inf = torch::tensor({speed * std::cos(pitch) * std::cos(yaw),
                              speed * std::cos(pitch) * std::sin(yaw), speed * std::sin(pitch)},
                             torch::kDouble);
  // Rejection-sample points outside the sphere.
  const int64_t n = o.points_per_sample;
  std::vector<torch::Tensor> kept;
  int64_t have = 0;
  while (have < n) {
    auto cand = torch::empty({n + n / 4 + 16, 3}, torch::kDouble).uniform_(-4.0, 4.0, gen);
    auto outside = (cand - center.view({1, 3})).norm(2, 1) > a * 1.001;
    auto sel = cand.index({outside});
    kept.push_back(sel);
    have += sel.size(0);
  }
  auto points = torch::cat(kept).narrow(0, 0, n).contiguous();
  auto r_vec = points - center.view({1, 3});
  auto r = r_vec.norm(2, 1, true);
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
  out.points = points.to(torch::kFloat);
  out.sdf = (r - a).to(torch::kFloat);
  out.sdf_normals = (r_vec / r).to(torch::kFloat);
  out.u_inf = u_inf.to(torch::kFloat);
  out.volume = torch::full({n}, 512.0 / static_cast<double>(n), torch::kFloat);
  out.targets["velocity"] = velocity.to(torch::kFloat);
  out.targets["pressure"] = pressure.to(torch::kFloat);
  out.targets["nut"] = nut.to(torch::kFloat);
  return out;
}

}  // namespace slipstream::aero
