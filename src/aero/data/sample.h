// A CFD sample: named per-point tensors and named global values, as a
// dataset holds them (PhysicsNeMo's `point_data` / `global_data`).
//
// point_data: (N, C) float tensors, one row per point (or per surface cell);
//   "points" (N, 3) is among them: the coordinates. Volume samples carry
//   sdf (N,1) and sdf_normals (N,3), surface samples normals (N,3) and
//   area (N,1); the target fields by their names (velocity, pressure, nut,
//   wss, ...); optional weights (volume or area).
// global_data: per-sample values: U_inf (3), rho_inf, p_inf, L_ref (1 each).
// Every accessor that fails names the sample's id and the missing tensor.
#pragma once

#include "aero/fields/field_schema.h"

#include <torch/types.h>

#include <map>
#include <string>

namespace slipstream::aero {

struct Sample {
  std::string id;  // file path or "synthetic:<index>"
  std::map<std::string, torch::Tensor> point_data;
  std::map<std::string, torch::Tensor> global_data;
  // A surface sample's polygons, for writing predictions back as a mesh:
  // vertices (V, 3), offsets (C + 1), connectivity. Empty for a volume.
  std::map<std::string, torch::Tensor> mesh;
  // When the sample holds only some of its points (a block read from its
  // file): which rows of the file they are (int64, one per point), and the
  // mean of all its points (double, 3), which the center transform uses.
  // Undefined for a whole sample (rows in order; the mean is computed).
  torch::Tensor rows;
  torch::Tensor points_mean;

  int64_t num_points() const;
  bool has_point(const std::string& name) const { return point_data.count(name) > 0; }
  bool has_global(const std::string& name) const { return global_data.count(name) > 0; }
  const torch::Tensor& point(const std::string& name) const;
  const torch::Tensor& global(const std::string& name) const;
  // A one-value global as a double, or `fallback` when absent.
  double global_scalar(const std::string& name, double fallback) const;
  // U_inf's magnitude, rho_inf (default 1) and p_inf (default 0).
  FreeStream free_stream() const;
};

// Which tensors, with how many channels, a run needs of every sample.
struct SampleLayout {
  std::map<std::string, int64_t> point_channels;  // name -> C of (N, C)
  std::map<std::string, int64_t> global_sizes;    // name -> number of values
};

// The layout a sample has (every tensor it holds).
SampleLayout layout_of(const Sample& sample);

// Checks that `s` holds every tensor of `required` with the right shape,
// that every point field has N rows, and that the coordinates, every
// required input and U_inf are finite. Targets are checked for finiteness
// too unless `allow_nonfinite_targets` (the loss masks them). Throws
// c10::Error naming the sample's id, the tensor and, for a non-finite
// value, its row (of the file, when the sample is a block of one).
void validate_sample(const Sample& s, const SampleLayout& required,
                     const std::vector<std::string>& target_names, bool allow_nonfinite_targets);

}  // namespace slipstream::aero
