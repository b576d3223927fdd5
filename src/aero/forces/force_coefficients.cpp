#include "aero/forces/force_coefficients.h"

#include "aero/geometry/vec3.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace slipstream::aero {

namespace {

using vec3::cross;
using vec3::dot;
using vec3::scale;
using vec3::sub;
Vec3 unit(const Vec3& a, const char* what) {
  const double n = std::sqrt(dot(a, a));
  TORCH_CHECK(n > 0 && std::isfinite(n), "forces: the ", what, " direction is zero or not finite");
  return scale(a, 1.0 / n);
}
Vec3 as_vec(const torch::Tensor& t) {
  const auto d = t.to(torch::kDouble).contiguous();
  return {d[0].item<double>(), d[1].item<double>(), d[2].item<double>()};
}

}  // namespace

const std::vector<std::string>& coefficient_names() {
  static const std::vector<std::string> names{"CD", "CL", "CS", "CMR", "CMP", "CMY"};
  return names;
}

ShearConvention parse_shear_convention(const std::string& value) {
  if (value == "wall_on_fluid") return ShearConvention::kWallOnFluid;
  if (value == "fluid_on_wall") return ShearConvention::kFluidOnWall;
  TORCH_CHECK(false, "forces: shear convention '", value,
              "' is not one of wall_on_fluid (OpenFOAM's wallShearStress, DrivAerML), "
              "fluid_on_wall");
}

std::string to_string(ShearConvention convention) {
  return convention == ShearConvention::kWallOnFluid ? "wall_on_fluid" : "fluid_on_wall";
}

AxisFrame axis_frame(const Vec3& flow_direction, const Vec3& up_direction) {
  AxisFrame f;
  f.drag = unit(flow_direction, "flow");
  const Vec3 up = unit(up_direction, "up");
  Vec3 lift = sub(up, scale(f.drag, dot(up, f.drag)));
  if (std::sqrt(dot(lift, lift)) < 1e-8) {
    // `up` is along the flow: use the world axis least aligned with it.
    int axis = 0;
    for (int k = 1; k < 3; ++k) {
      if (std::abs(f.drag[k]) < std::abs(f.drag[axis])) axis = k;
    }
    Vec3 world{0, 0, 0};
    world[axis] = 1.0;
    lift = sub(world, scale(f.drag, dot(world, f.drag)));
  }
  f.lift = unit(lift, "lift");
  f.side = unit(cross(f.lift, f.drag), "side");
  return f;
}

std::map<std::string, double> force_coefficients(const torch::Tensor& centroids,
                                                 const torch::Tensor& normals,
                                                 const torch::Tensor& areas,
                                                 const torch::Tensor& cp, const torch::Tensor& cf,
                                                 const Vec3& flow, const ForceOptions& o) {
  const int64_t c = centroids.size(0);
  TORCH_CHECK(centroids.dim() == 2 && centroids.size(1) == 3 &&
                  normals.sizes() == centroids.sizes() && cf.sizes() == centroids.sizes() &&
                  areas.numel() == c && cp.numel() == c,
              "forces: expected centroids, normals and Cf (C, 3), areas and Cp (C); got ",
              centroids.sizes(), ", ", normals.sizes(), ", ", cf.sizes(), ", ", areas.sizes(), ", ",
              cp.sizes());
  TORCH_CHECK(o.reference_area > 0 && o.reference_length > 0,
              "forces: reference_area and reference_length must be > 0");
  const auto x = centroids.to(torch::kDouble);
  const auto a = areas.to(torch::kDouble).reshape({c, 1});
  // The body feels the fluid's stress on the wall: the field itself, or
  // minus the wall's stress on the fluid.
  const double shear_sign = o.shear == ShearConvention::kWallOnFluid ? -1.0 : 1.0;
  const auto t = -cp.to(torch::kDouble).reshape({c, 1}) * normals.to(torch::kDouble) +
                 shear_sign * cf.to(torch::kDouble);  // (C, 3)
  const auto center =
      torch::tensor({o.moment_center[0], o.moment_center[1], o.moment_center[2]}, torch::kDouble)
          .view({1, 3});
  const Vec3 force = as_vec((t * a).sum(0) / o.reference_area);
  const Vec3 moment = as_vec(torch::cross(x - center, t, 1).mul(a).sum(0) /
                             (o.reference_area * o.reference_length));
  const AxisFrame f = axis_frame(flow, o.up_direction);
  return {{"CD", dot(force, f.drag)},   {"CL", dot(force, f.lift)},   {"CS", dot(force, f.side)},
          {"CMR", dot(moment, f.drag)}, {"CMP", dot(moment, f.side)}, {"CMY", dot(moment, f.lift)}};
}

std::map<std::string, CoefficientSummary> summarize_coefficients(
    const std::vector<std::map<std::string, double>>& pred,
    const std::vector<std::map<std::string, double>>& truth) {
  TORCH_CHECK(pred.size() == truth.size(), "forces: ", pred.size(), " predictions for ",
              truth.size(), " truths");
  std::map<std::string, CoefficientSummary> out;
  const double n = static_cast<double>(pred.size());
  for (const auto& name : coefficient_names()) {
    const auto has = [&](const std::map<std::string, double>& m) { return m.count(name) > 0; };
    if (pred.empty() || !std::all_of(pred.begin(), pred.end(), has) ||
        !std::all_of(truth.begin(), truth.end(), has)) {
      continue;  // summarised only where every sample has it
    }
    CoefficientSummary s;
    s.samples = static_cast<int64_t>(pred.size());
    for (size_t i = 0; i < pred.size(); ++i) {
      s.pred_mean += pred[i].at(name) / n;
      s.true_mean += truth[i].at(name) / n;
      s.mae += std::abs(pred[i].at(name) - truth[i].at(name)) / n;
    }
    double residual = 0, spread = 0;
    for (size_t i = 0; i < pred.size(); ++i) {
      residual += std::pow(pred[i].at(name) - truth[i].at(name), 2);
      spread += std::pow(truth[i].at(name) - s.true_mean, 2);
    }
    // A truth that does not vary over the split (a standard deviation below
    // kConstantTruth, far under what a CFD resolves): R^2 is undefined.
    const bool varies = spread > n * kConstantTruth * kConstantTruth;
    s.r2 = pred.size() >= 2 && varies ? 1.0 - residual / spread
                                      : std::numeric_limits<double>::quiet_NaN();
    out[name] = s;
  }
  return out;
}

}  // namespace slipstream::aero
