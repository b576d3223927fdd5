#include "aero/model/geotransolver/options.h"

#include "aero/model/family_options.h"
#include "aero/model/physicsnemo_args.h"

#include <c10/util/Exception.h>

namespace slipstream::aero {

GeoTransolverOptions geotransolver_options(const Config& c, const ModelShape& shape) {
  GeoTransolverOptions m;
  m.functional_dim = shape.input_widths.at("local_embedding");
  m.geometry_dim = shape.input_widths.at("geometry");
  m.global_dim = shape.input_widths.at("global_embedding");
  TORCH_CHECK(shape.input_widths.at("local_positions") == 3,
              "config: 'model.inputs.local_positions' must be 3-D points, got width ",
              shape.input_widths.at("local_positions"));
  m.out_dim = shape.out_dim;
  read_block_keys(c, m);
  m.include_local_features = c.get<bool>("model.include_local_features");
  m.radii = c.get<std::vector<double>>("model.radii");
  m.neighbors_in_radius.clear();
  for (double k : c.get<std::vector<double>>("model.neighbors_in_radius")) {
    TORCH_CHECK(k >= 1 && k == static_cast<double>(static_cast<int64_t>(k)),
                "config: 'model.neighbors_in_radius' must hold positive integers, got ", k);
    m.neighbors_in_radius.push_back(static_cast<int64_t>(k));
  }
  m.n_hidden_local = c.get<int64_t>("model.n_hidden_local");
  m.state_mixing_mode = c.get<std::string>("model.state_mixing_mode");
  read_code_path_keys(c, m);
  if (c.has("model.mlp_keep_gelu_layers")) {
    m.mlp_keep_gelu_layers = c.get<int64_t>("model.mlp_keep_gelu_layers");
  }
  check_block_keys(m);
  check_positive("model.n_hidden_local", static_cast<double>(m.n_hidden_local));
  TORCH_CHECK(m.radii.size() == m.neighbors_in_radius.size(), "config: 'model.radii' has ",
              m.radii.size(), " entries but 'model.neighbors_in_radius' has ",
              m.neighbors_in_radius.size());
  for (double r : m.radii) TORCH_CHECK(r > 0, "config: 'model.radii' must be > 0, got ", r);
  TORCH_CHECK(m.state_mixing_mode == "weighted" || m.state_mixing_mode == "concat_project",
              "config: 'model.state_mixing_mode' is '", m.state_mixing_mode,
              "', expected one of: weighted, concat_project");
  return m;
}

GeoTransolverOptions geotransolver_options(const nlohmann::json& a, const std::string& what) {
  require_physicsnemo_args(a,
                           {{"dropout", 0.0},
                            {"act", "gelu"},
                            {"structured_shape", nullptr},
                            {"use_te", false},
                            {"time_input", false},
                            {"plus", false},
                            {"attention_type", "GALE"},
                            {"concrete_dropout", false}},
                           what);
  GeoTransolverOptions m;
  m.functional_dim = physicsnemo_arg<int64_t>(a, "functional_dim", what);
  m.geometry_dim = physicsnemo_dim_arg(a, "geometry_dim", what);
  m.global_dim = physicsnemo_dim_arg(a, "global_dim", what);
  m.out_dim = physicsnemo_arg<int64_t>(a, "out_dim", what);
  read_block_args(a, what, m);
  m.include_local_features = physicsnemo_arg<bool>(a, "include_local_features", what);
  m.radii = physicsnemo_arg<std::vector<double>>(a, "radii", what);
  m.neighbors_in_radius = physicsnemo_arg<std::vector<int64_t>>(a, "neighbors_in_radius", what);
  m.n_hidden_local = physicsnemo_arg<int64_t>(a, "n_hidden_local", what);
  m.state_mixing_mode = physicsnemo_arg<std::string>(a, "state_mixing_mode", what);
  TORCH_CHECK(m.radii.size() == m.neighbors_in_radius.size(), "'", what,
              "': args.json 'radii' and 'neighbors_in_radius' differ in length");
  TORCH_CHECK(m.state_mixing_mode == "weighted" || m.state_mixing_mode == "concat_project", "'",
              what, "': args.json 'state_mixing_mode' is '", m.state_mixing_mode,
              "', expected weighted or concat_project");
  return m;
}

nlohmann::json physicsnemo_args(const GeoTransolverOptions& o) {
  auto dim_or_none = [](int64_t d) { return d > 0 ? nlohmann::json(d) : nlohmann::json(nullptr); };
  return {{"functional_dim", o.functional_dim},
          {"out_dim", o.out_dim},
          {"geometry_dim", dim_or_none(o.geometry_dim)},
          {"global_dim", dim_or_none(o.global_dim)},
          {"n_layers", o.n_layers},
          {"n_hidden", o.n_hidden},
          {"dropout", 0.0},
          {"n_head", o.n_head},
          {"act", "gelu"},
          {"mlp_ratio", o.mlp_ratio},
          {"slice_num", o.slice_num},
          {"use_te", false},
          {"time_input", false},
          {"plus", false},
          {"include_local_features", o.include_local_features},
          {"radii", o.radii},
          {"neighbors_in_radius", o.neighbors_in_radius},
          {"n_hidden_local", o.n_hidden_local},
          {"structured_shape", nullptr},
          {"attention_type", "GALE"},
          {"concrete_dropout", false},
          {"state_mixing_mode", o.state_mixing_mode}};
}

}  // namespace slipstream::aero
