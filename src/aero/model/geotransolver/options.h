// GeoTransolver's options and the two places they come from: a config's
// `model.` section (with the input widths of the data) and PhysicsNeMo's
// constructor arguments (a .mdlus's args.json), and back to the latter.
#pragma once

#include "aero/config/config.h"
#include "aero/model/model.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace slipstream::aero {

// Added to the slice weights' sum over points before normalising (fixed in
// PhysicsNeMo's GeoTransolver).
constexpr double kGeoSliceNormEps = 1e-2;

struct GeoTransolverOptions {
  int64_t functional_dim = 7;
  int64_t geometry_dim = 3;  // 0: no geometry context
  int64_t global_dim = 3;    // 0: no global context
  int64_t out_dim = 5;
  int64_t n_layers = 12;
  int64_t n_hidden = 256;
  int64_t n_head = 8;
  int64_t slice_num = 256;
  int64_t mlp_ratio = 4;
  bool include_local_features = true;
  std::vector<double> radii{0.01, 0.05, 0.25, 1.0, 2.5, 5.0};
  std::vector<int64_t> neighbors_in_radius{8, 16, 32, 32, 64, 128};
  int64_t n_hidden_local = 32;
  std::string state_mixing_mode = "weighted";  // weighted | concat_project
  bool bf16_layer_norm = true;                 // as TransolverOptions::bf16_layer_norm
  bool fused_attention = true;                 // GALE on the fused slice kernels where they apply
  bool mlp_recompute_gelu = true;              // as TransolverOptions::mlp_recompute_gelu
  // With mlp_recompute_gelu: the MLPs of the last this many GALE blocks keep
  // gelu(h) for the backward too (Mlp's keep_gelu): more memory (one hidden
  // layer of mlp_ratio·width a point each), less time (one pass less over
  // it).
  int64_t mlp_keep_gelu_layers = 0;
};

// From `model.` (widths from `shape`); throws naming the key.
GeoTransolverOptions geotransolver_options(const Config& config, const ModelShape& shape);
// From args.json's `__args__`; `what` (the file) names errors, among them
// an argument Slipstream does not implement.
GeoTransolverOptions geotransolver_options(const nlohmann::json& args, const std::string& what);
// The constructor arguments that build this model in PhysicsNeMo.
nlohmann::json physicsnemo_args(const GeoTransolverOptions& o);

}  // namespace slipstream::aero
