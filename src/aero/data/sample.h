// A CFD sample: a point cloud of a volume mesh with its geometry features,
// target fields and free-stream conditions.
//   points (N,3), sdf (N,1), sdf_normals (N,3)      geometry
//   velocity (N,3), pressure (N,1), nut (N,1)        targets (by field name)
//   U_inf (3)                                        free stream
//   volume (N)                                       optional cell volumes
#pragma once

#include <torch/types.h>

#include <map>
#include <string>

namespace slipstream::aero {

struct Sample {
  std::string id;      // file path or "synthetic:<index>"
  torch::Tensor points, sdf, sdf_normals, u_inf, volume;
  double rho_inf = 1.0;  // free-stream density
  double p_inf = 0.0;    // free-stream pressure
  std::map<std::string, torch::Tensor> targets;

  int64_t num_points() const { return points.defined() ? points.size(0) : 0; }
};

// Checks shapes, point counts and finite geometry; throws c10::Error naming
// the sample's id and the offending field.
void validate_sample(const Sample& s, const std::vector<std::string>& target_names);

}  // namespace slipstream::aero
