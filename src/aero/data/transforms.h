// The recipe's per-sample transforms, applied on the host by the loader
// after subsampling (and by `slipstream infer` before the model):
//   center             subtract the sample's mean point from the coordinates
//   nondimensionalize  velocity / |U_inf|; pressure (p - p_inf) / (0.5 rho |U_inf|^2)
//   nut_mean, nut_std  nut -> (nut - mean) / std
//   rotate_z_max_deg   augmentation: a random rotation about z of points,
//                      normals, velocity and U_inf together (train only)
//   translate_max      augmentation: a random shift of the points (train only)
// Field names are the target names (velocity, pressure, nut); a target the
// sample does not have is left alone.
#pragma once

#include <torch/types.h>

#include <string>

namespace slipstream::aero {

struct TransformOptions {
  std::string subsample = "random";  // random | block (a contiguous run of points)
  bool center = false;
  bool nondimensionalize = false;
  double nut_mean = 0.0;
  double nut_std = 1.0;
  double rotate_z_max_deg = 0.0;
  double translate_max = 0.0;
};

// Rotation about z by `radians` applied to the rows of an (N,3) tensor.
torch::Tensor rotate_z(const torch::Tensor& xyz, double radians);

}  // namespace slipstream::aero
