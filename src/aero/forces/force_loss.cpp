#include "aero/forces/force_loss.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace slipstream::aero {

ForceFields force_fields(const FieldSchema& fields) {
  ForceFields out;
  for (size_t i = 0; i < fields.size(); ++i) {
    const auto& f = fields.fields()[i];
    if (f.nondim == Nondim::kPressure && f.type == FieldType::kScalar && out.pressure < 0) {
      out.pressure = static_cast<int>(i);
    }
    if (f.nondim == Nondim::kStress && f.type == FieldType::kVector && out.wss < 0) {
      out.wss = static_cast<int>(i);
    }
  }
  return out;
}

void check_force_loss(const ForceLossOptions& o) {
  TORCH_CHECK(std::isfinite(o.weight) && o.weight >= 0,
              "config: 'loss.forces.weight' must be >= 0 (0: off), not ", o.weight);
  TORCH_CHECK(std::isfinite(o.scale) && o.scale > 0,
              "config: 'loss.forces.scale' must be > 0, not ", o.scale);
  TORCH_CHECK(!o.coefficients.empty(),
              "config: 'loss.forces.coefficients' must name at least one of CD, CL, CS");
  std::set<std::string> seen;
  for (const auto& c : o.coefficients) {
    TORCH_CHECK(c == "CD" || c == "CL" || c == "CS", "config: 'loss.forces.coefficients': '", c,
                "' is not one of CD, CL, CS");
    TORCH_CHECK(seen.insert(c).second, "config: 'loss.forces.coefficients' names ", c, " twice");
  }
}

torch::Tensor force_loss_weights(const torch::Tensor& normals, const torch::Tensor& areas,
                                 const FieldSchema& fields, const FreeStream& free_stream,
                                 const Vec3& flow, double a_ref, double fraction,
                                 const ForceLossFrame& frame) {
  const ForceFields which = force_fields(fields);
  TORCH_CHECK(which.available(), "loss.forces: the targets (", fields.names().size(),
              ") need a scalar with nondim 'pressure' and a vector with nondim 'stress'");
  const int64_t n = normals.size(0);
  TORCH_CHECK(normals.dim() == 2 && normals.size(1) == 3 && areas.numel() == n,
              "loss.forces: expected normals (N, 3) and areas (N), got ", normals.sizes(), " and ",
              areas.sizes());
  const double q = free_stream.dynamic_pressure();
  TORCH_CHECK(q > 0 && a_ref > 0 && fraction > 0,
              "loss.forces: needs a positive dynamic pressure, A_ref and kept fraction (", q, ", ",
              a_ref, ", ", fraction, ")");
  const AxisFrame axes = axis_frame(flow, frame.up_direction);
  // The slope of each channel's map to physical units.
  std::vector<double> slope(static_cast<size_t>(fields.total_channels()));
  for (size_t i = 0; i < fields.size(); ++i) {
    const auto& f = fields.fields()[i];
    const auto one = torch::ones({1, f.channels()}, torch::kDouble);
    const auto d =
        (fields.to_physical(f, one, free_stream) - fields.to_physical(f, one * 0, free_stream))
            .view({-1});
    for (int64_t c = 0; c < f.channels(); ++c) {
      slope[static_cast<size_t>(fields.offset(i) + c)] = d[c].item<double>();
    }
  }
  const int64_t channels = fields.total_channels();
  const auto k = static_cast<int64_t>(frame.coefficients.size());
  const double shear_sign = frame.shear == ShearConvention::kWallOnFluid ? -1.0 : 1.0;
  const auto a = areas.reshape({n, 1}).to(torch::kDouble) * (fraction / (q * a_ref));
  const auto nd = normals.to(torch::kDouble);
  auto w = torch::zeros({n, channels, k}, torch::kDouble);
  const int64_t p0 = fields.offset(static_cast<size_t>(which.pressure));
  const int64_t t0 = fields.offset(static_cast<size_t>(which.wss));
  for (int64_t j = 0; j < k; ++j) {
    const auto& name = frame.coefficients[static_cast<size_t>(j)];
    const Vec3& e = name == "CD" ? axes.drag : name == "CL" ? axes.lift : axes.side;
    const auto axis = torch::tensor({e[0], e[1], e[2]}, torch::kDouble);
    // Pressure: -(n . e) a; shear: -/+ e_c a per component.
    w.select(2, j).select(1, p0).copy_(-(nd.matmul(axis)) * a.view({n}) *
                                       slope[static_cast<size_t>(p0)]);
    for (int64_t c = 0; c < 3; ++c) {
      w.select(2, j).select(1, t0 + c).copy_(a.view({n}) * (shear_sign * e[static_cast<size_t>(c)] *
                                                            slope[static_cast<size_t>(t0 + c)]));
    }
  }
  return w.to(torch::kFloat);
}

}  // namespace slipstream::aero
