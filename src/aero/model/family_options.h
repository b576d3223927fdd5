// The options every model family here shares, read alike: the block stack's
// n_layers, n_hidden, n_head, slice_num and mlp_ratio from a config's
// `model.` section or from PhysicsNeMo's args.json, and the code paths
// (fused_attention, bf16_layer_norm, mlp_recompute_gelu) from the config.
// Each family's options file (transolver/options.h, geotransolver/
// options.h) calls these for the keys its options struct shares.
#pragma once

#include "aero/config/config.h"
#include "aero/model/physicsnemo_args.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace slipstream::aero {

template <class Options>
void read_block_keys(const Config& c, Options& m) {
  m.n_layers = c.get<int64_t>("model.n_layers");
  m.n_hidden = c.get<int64_t>("model.n_hidden");
  m.n_head = c.get<int64_t>("model.n_head");
  m.slice_num = c.get<int64_t>("model.slice_num");
  m.mlp_ratio = c.get<int64_t>("model.mlp_ratio");
}

template <class Options>
void read_code_path_keys(const Config& c, Options& m) {
  m.fused_attention = c.get<bool>("model.fused_attention");
  m.bf16_layer_norm = c.get<bool>("model.bf16_layer_norm");
  m.mlp_recompute_gelu = c.get<bool>("model.mlp_recompute_gelu");
}

// Every block key > 0 and n_hidden a multiple of n_head, naming the keys.
template <class Options>
void check_block_keys(const Options& m) {
  check_positive("model.n_layers", static_cast<double>(m.n_layers));
  check_positive("model.n_hidden", static_cast<double>(m.n_hidden));
  check_positive("model.n_head", static_cast<double>(m.n_head));
  check_positive("model.slice_num", static_cast<double>(m.slice_num));
  check_positive("model.mlp_ratio", static_cast<double>(m.mlp_ratio));
  TORCH_CHECK(m.n_hidden % m.n_head == 0, "config: 'model.n_hidden' (", m.n_hidden,
              ") must be divisible by 'model.n_head' (", m.n_head, ")");
}

// The block keys from args.json; `what` (the file) names errors.
template <class Options>
void read_block_args(const nlohmann::json& a, const std::string& what, Options& m) {
  m.n_layers = physicsnemo_arg<int64_t>(a, "n_layers", what);
  m.n_hidden = physicsnemo_arg<int64_t>(a, "n_hidden", what);
  m.n_head = physicsnemo_arg<int64_t>(a, "n_head", what);
  m.slice_num = physicsnemo_arg<int64_t>(a, "slice_num", what);
  m.mlp_ratio = physicsnemo_arg<int64_t>(a, "mlp_ratio", what);
  TORCH_CHECK(m.n_hidden > 0 && m.n_head > 0 && m.n_hidden % m.n_head == 0, "'", what,
              "': args.json 'n_hidden' (", m.n_hidden, ") must be a multiple of 'n_head' (",
              m.n_head, ")");
}

}  // namespace slipstream::aero
