#include "aero/model/transolver/options.h"

#include "aero/model/physicsnemo_args.h"

#include <c10/util/Exception.h>

namespace slipstream::aero {

TransolverOptions transolver_options(const Config& c, const ModelShape& shape) {
  TransolverOptions m;
  m.embedding_dim = shape.input_widths.at("embedding");
  m.functional_dim = shape.input_widths.at("fx");
  m.out_dim = shape.out_dim;
  m.n_layers = c.get<int64_t>("model.n_layers");
  m.n_hidden = c.get<int64_t>("model.n_hidden");
  m.n_head = c.get<int64_t>("model.n_head");
  m.slice_num = c.get<int64_t>("model.slice_num");
  m.mlp_ratio = c.get<int64_t>("model.mlp_ratio");
  m.fused_attention = c.get<bool>("model.fused_attention");
  m.bf16_layer_norm = c.get<bool>("model.bf16_layer_norm");
  m.mlp_recompute_gelu = c.get<bool>("model.mlp_recompute_gelu");
  for (const char* k :
       {"model.n_layers", "model.n_hidden", "model.n_head", "model.slice_num", "model.mlp_ratio"}) {
    check_positive(k, c.get<int64_t>(k));
  }
  TORCH_CHECK(m.n_hidden % m.n_head == 0, "config: 'model.n_hidden' (", m.n_hidden,
              ") must be divisible by 'model.n_head' (", m.n_head, ")");
  return m;
}

TransolverOptions transolver_options(const nlohmann::json& a, const std::string& what) {
  require_physicsnemo_args(a,
                           {{"dropout", 0.0},
                            {"act", "gelu"},
                            {"unified_pos", false},
                            {"structured_shape", nullptr},
                            {"use_te", false},
                            {"time_input", false},
                            {"plus", false}},
                           what);
  TransolverOptions m;
  m.functional_dim = physicsnemo_arg<int64_t>(a, "functional_dim", what);
  m.embedding_dim = physicsnemo_arg<int64_t>(a, "embedding_dim", what);
  m.out_dim = physicsnemo_arg<int64_t>(a, "out_dim", what);
  m.n_layers = physicsnemo_arg<int64_t>(a, "n_layers", what);
  m.n_hidden = physicsnemo_arg<int64_t>(a, "n_hidden", what);
  m.n_head = physicsnemo_arg<int64_t>(a, "n_head", what);
  m.slice_num = physicsnemo_arg<int64_t>(a, "slice_num", what);
  m.mlp_ratio = physicsnemo_arg<int64_t>(a, "mlp_ratio", what);
  TORCH_CHECK(m.n_hidden > 0 && m.n_head > 0 && m.n_hidden % m.n_head == 0, "'", what,
              "': args.json 'n_hidden' (", m.n_hidden, ") must be a multiple of 'n_head' (",
              m.n_head, ")");
  return m;
}

nlohmann::json physicsnemo_args(const TransolverOptions& o) {
  return {{"functional_dim", o.functional_dim},
          {"out_dim", o.out_dim},
          {"embedding_dim", o.embedding_dim},
          {"n_layers", o.n_layers},
          {"n_hidden", o.n_hidden},
          {"dropout", 0.0},
          {"n_head", o.n_head},
          {"act", "gelu"},
          {"mlp_ratio", o.mlp_ratio},
          {"slice_num", o.slice_num},
          {"unified_pos", false},
          {"ref", 8},
          {"structured_shape", nullptr},
          {"use_te", false},
          {"time_input", false},
          {"plus", false}};
}

}  // namespace slipstream::aero
