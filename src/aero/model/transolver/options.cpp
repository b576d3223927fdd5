#include "aero/model/transolver/options.h"

#include "aero/model/family_options.h"
#include "aero/model/physicsnemo_args.h"

#include <c10/util/Exception.h>

namespace slipstream::aero {

TransolverOptions transolver_options(const Config& c, const ModelShape& shape) {
  TransolverOptions m;
  m.embedding_dim = shape.input_widths.at("embedding");
  m.functional_dim = shape.input_widths.at("fx");
  m.out_dim = shape.out_dim;
  read_block_keys(c, m);
  read_code_path_keys(c, m);
  check_block_keys(m);
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
  read_block_args(a, what, m);
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
