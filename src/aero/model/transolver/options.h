// Transolver's options and the two places they come from: a config's
// `model.` section (with the input widths of the data) and PhysicsNeMo's
// constructor arguments (a .mdlus's args.json), and back to the latter.
#pragma once

#include "aero/config/config.h"
#include "aero/model/model.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace slipstream::aero {

struct TransolverOptions {
  int64_t functional_dim = 3;
  int64_t embedding_dim = 7;
  int64_t out_dim = 5;
  int64_t n_layers = 12;
  int64_t n_hidden = 256;
  int64_t n_head = 8;
  int64_t slice_num = 256;
  int64_t mlp_ratio = 4;
  // Added to the slice weights' sum over points before normalising.
  double slice_norm_eps = 1e-2;
  // Run slice -> attention -> deslice through fused_physics_attention (CUDA
  // kernels that keep no points x heads x slices tensor) where its kernels
  // apply: CUDA, bf16 autocast, dim_head 16/32/56/64, slices a multiple of 16
  // up to 256. Elsewhere, and when false, the plain LibTorch path.
  bool fused_attention = true;
  // Under bf16 autocast, LayerNorm in bf16 (fused_layer_norm.h: bf16 in and
  // out, fp32 statistics; CUDA kernels where they apply) instead of
  // autocast's fp32 LayerNorm and the casts around it. No effect without
  // autocast.
  bool bf16_layer_norm = true;
  // Each MLP keeps its hidden layer for the backward once, before its GELU,
  // and recomputes the GELU there (MlpImpl::recompute_gelu): less memory
  // for one more GELU a step.
  bool mlp_recompute_gelu = false;
};

// From `model.` (widths from `shape`); throws naming the key.
TransolverOptions transolver_options(const Config& config, const ModelShape& shape);
// From args.json's `__args__`; `what` (the file) names errors, among them
// an argument Slipstream does not implement (dropout, Transformer Engine,
// ...).
TransolverOptions transolver_options(const nlohmann::json& args, const std::string& what);
// The constructor arguments that build this model in PhysicsNeMo.
nlohmann::json physicsnemo_args(const TransolverOptions& o);

}  // namespace slipstream::aero
