// The recipe's per-sample transforms, applied on the host by the loader
// after subsampling (and by inference before the model), in this order:
//   center             subtract the sample's mean point from the coordinates
//   scale_by_L_ref     divide the coordinates and the SDF by the sample's
//                      L_ref (lengths in units of the vehicle's length, as
//                      the recipe's radii and meshes are)
//   rotate_z_max_deg   augmentation (train only): one rotation about z, the
//                      angle uniform in +-max, of the points, of every vector
//                      point field (a target declared `vector`, or any other
//                      3-channel field: sdf_normals, normals) and of U_inf
//   translate_max      augmentation (train only): a shift of the points in x
//                      and y, each uniform in +-max (z is left alone)
// Non-dimensionalisation and normalisation of the targets follow, per field,
// from the dataset's FieldSchema (aero/fields/field_schema.h).
#pragma once

#include "aero/fields/field_schema.h"

#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <map>
#include <string>

namespace slipstream::aero {

struct TransformOptions {
  std::string subsample = "random";  // random | block (a contiguous run of points)
  bool center = false;
  bool scale_by_L_ref = false;
  double rotate_z_max_deg = 0.0;
  double translate_max = 0.0;
};

// The rows a subsample keeps of n: k of them drawn from `gen`, a random
// subset (randperm's first k) or a contiguous block at a random start;
// undefined (keep all, in order) when k <= 0 or k >= n.
torch::Tensor subsample_indices(int64_t n, int64_t k, const std::string& mode, at::Generator& gen);

// Rotation about z by `radians` applied to the rows of an (N, 3) tensor.
torch::Tensor rotate_z(const torch::Tensor& xyz, double radians);

// Which point fields turn with a rotation: "points", every target the
// schema declares a vector, and every other field with 3 channels.
bool turns_with_rotation(const std::string& name, const torch::Tensor& field,
                         const FieldSchema& schema);

// The augmentation of one sample, drawn from `gen` (train only): rotates
// and shifts the point fields and U_inf in place. A no-op when both
// maxima are 0.
void augment(std::map<std::string, torch::Tensor>& point,
             std::map<std::string, torch::Tensor>& global, const TransformOptions& options,
             const FieldSchema& schema, at::Generator& gen);

}  // namespace slipstream::aero
