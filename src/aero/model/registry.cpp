#include "aero/model/registry.h"

#include "aero/model/geotransolver.h"
#include "aero/model/transolver.h"
#include "core/process/host_memory.h"
#include "core/text/join.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <functional>

namespace slipstream::aero {

namespace {

// A model far beyond the machine is named by its keys before it is built
// (building it would grow for minutes before a bare std::bad_alloc). Each
// layer holds about (2·mlp_ratio + 4)·n_hidden² weights (the MLP and the
// attention's projections; `per_layer` scales it for a family with more),
// and training keeps 4 fp32 copies (weights, gradients, two moments).
void check_fits_in_memory(const Config& c, double per_layer) {
  const uint64_t available = available_host_memory();
  if (available == 0) return;
  const double layers = static_cast<double>(c.get<int64_t>("model.n_layers"));
  const double hidden = static_cast<double>(c.get<int64_t>("model.n_hidden"));
  const double ratio = static_cast<double>(c.get<int64_t>("model.mlp_ratio"));
  const double bytes = layers * per_layer * (2 * ratio + 4) * hidden * hidden * 4.0 * 4.0;
  TORCH_CHECK(bytes <= static_cast<double>(available),
              "config: a model of model.n_layers=", static_cast<int64_t>(layers),
              ", model.n_hidden=", static_cast<int64_t>(hidden),
              " and model.mlp_ratio=", static_cast<int64_t>(ratio), " needs about ",
              format_gib(bytes), " to train (weights, gradients, optimizer state), more than the ",
              format_gib(static_cast<double>(available)),
              " this machine has available; make model.n_layers or model.n_hidden smaller");
}

ModelPtr build_transolver(const Config& c, const ModelShape& shape) {
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
  check_fits_in_memory(c, 1.0);
  return Transolver(m).ptr();
}

ModelPtr build_geotransolver(const Config& c, const ModelShape& shape) {
  GeoTransolverOptions m;
  m.functional_dim = shape.input_widths.at("local_embedding");
  m.geometry_dim = shape.input_widths.at("geometry");
  m.global_dim = shape.input_widths.at("global_embedding");
  TORCH_CHECK(shape.input_widths.at("local_positions") == 3,
              "config: 'model.inputs.local_positions' must be 3-D points, got width ",
              shape.input_widths.at("local_positions"));
  m.out_dim = shape.out_dim;
  m.n_layers = c.get<int64_t>("model.n_layers");
  m.n_hidden = c.get<int64_t>("model.n_hidden");
  m.n_head = c.get<int64_t>("model.n_head");
  m.slice_num = c.get<int64_t>("model.slice_num");
  m.mlp_ratio = c.get<int64_t>("model.mlp_ratio");
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
  m.bf16_layer_norm = c.get<bool>("model.bf16_layer_norm");
  m.fused_attention = c.get<bool>("model.fused_attention");
  m.mlp_recompute_gelu = c.get<bool>("model.mlp_recompute_gelu");
  if (c.has("model.mlp_keep_gelu_layers")) {
    m.mlp_keep_gelu_layers = c.get<int64_t>("model.mlp_keep_gelu_layers");
  }
  for (const char* k : {"model.n_layers", "model.n_hidden", "model.n_head", "model.slice_num",
                        "model.mlp_ratio", "model.n_hidden_local"}) {
    check_positive(k, c.get<int64_t>(k));
  }
  TORCH_CHECK(m.n_hidden % m.n_head == 0, "config: 'model.n_hidden' (", m.n_hidden,
              ") must be divisible by 'model.n_head' (", m.n_head, ")");
  TORCH_CHECK(m.radii.size() == m.neighbors_in_radius.size(), "config: 'model.radii' has ",
              m.radii.size(), " entries but 'model.neighbors_in_radius' has ",
              m.neighbors_in_radius.size());
  for (double r : m.radii) TORCH_CHECK(r > 0, "config: 'model.radii' must be > 0, got ", r);
  TORCH_CHECK(m.state_mixing_mode == "weighted" || m.state_mixing_mode == "concat_project",
              "config: 'model.state_mixing_mode' is '", m.state_mixing_mode,
              "', expected one of: weighted, concat_project");
  check_fits_in_memory(c, 2.0);  // GALE's self and cross attention
  return GeoTransolver(m).ptr();
}

// args.json readers: `what` names the file.
template <class T>
T arg(const nlohmann::json& args, const char* key, const std::string& what) {
  TORCH_CHECK(args.contains(key), "'", what, "': args.json has no '", key, "'");
  try {
    return args.at(key).get<T>();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "'", what, "': args.json '", key, "' is ", args.at(key).dump(), ": ",
                e.what());
  }
}

bool same_value(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  if (a.is_array() && b.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!same_value(a[i], b[i])) return false;
    }
    return true;
  }
  return a == b;
}

// An argument Slipstream implements only at one value (absent: the default).
void require_arg(const nlohmann::json& args, const char* key, const nlohmann::json& want,
                 const std::string& what) {
  if (!args.contains(key) || same_value(args.at(key), want)) return;
  TORCH_CHECK(false, "'", what, "': args.json '", key, "' is ", args.at(key).dump(),
              "; Slipstream implements only ", want.dump());
}

int64_t dim_arg(const nlohmann::json& args, const char* key, const std::string& what) {
  return args.contains(key) && args.at(key).is_null() ? 0 : arg<int64_t>(args, key, what);
}

ModelPtr transolver_from_args(const nlohmann::json& a, const std::string& what) {
  for (const auto& [key, want] :
       std::vector<std::pair<const char*, nlohmann::json>>{{"dropout", 0.0},
                                                           {"act", "gelu"},
                                                           {"unified_pos", false},
                                                           {"structured_shape", nullptr},
                                                           {"use_te", false},
                                                           {"time_input", false},
                                                           {"plus", false}}) {
    require_arg(a, key, want, what);
  }
  TransolverOptions m;
  m.functional_dim = arg<int64_t>(a, "functional_dim", what);
  m.embedding_dim = arg<int64_t>(a, "embedding_dim", what);
  m.out_dim = arg<int64_t>(a, "out_dim", what);
  m.n_layers = arg<int64_t>(a, "n_layers", what);
  m.n_hidden = arg<int64_t>(a, "n_hidden", what);
  m.n_head = arg<int64_t>(a, "n_head", what);
  m.slice_num = arg<int64_t>(a, "slice_num", what);
  m.mlp_ratio = arg<int64_t>(a, "mlp_ratio", what);
  TORCH_CHECK(m.n_hidden > 0 && m.n_head > 0 && m.n_hidden % m.n_head == 0, "'", what,
              "': args.json 'n_hidden' (", m.n_hidden, ") must be a multiple of 'n_head' (",
              m.n_head, ")");
  return Transolver(m).ptr();
}

ModelPtr geotransolver_from_args(const nlohmann::json& a, const std::string& what) {
  for (const auto& [key, want] :
       std::vector<std::pair<const char*, nlohmann::json>>{{"dropout", 0.0},
                                                           {"act", "gelu"},
                                                           {"structured_shape", nullptr},
                                                           {"use_te", false},
                                                           {"time_input", false},
                                                           {"plus", false},
                                                           {"attention_type", "GALE"},
                                                           {"concrete_dropout", false}}) {
    require_arg(a, key, want, what);
  }
  GeoTransolverOptions m;
  m.functional_dim = arg<int64_t>(a, "functional_dim", what);
  m.geometry_dim = dim_arg(a, "geometry_dim", what);
  m.global_dim = dim_arg(a, "global_dim", what);
  m.out_dim = arg<int64_t>(a, "out_dim", what);
  m.n_layers = arg<int64_t>(a, "n_layers", what);
  m.n_hidden = arg<int64_t>(a, "n_hidden", what);
  m.n_head = arg<int64_t>(a, "n_head", what);
  m.slice_num = arg<int64_t>(a, "slice_num", what);
  m.mlp_ratio = arg<int64_t>(a, "mlp_ratio", what);
  m.include_local_features = arg<bool>(a, "include_local_features", what);
  m.radii = arg<std::vector<double>>(a, "radii", what);
  m.neighbors_in_radius = arg<std::vector<int64_t>>(a, "neighbors_in_radius", what);
  m.n_hidden_local = arg<int64_t>(a, "n_hidden_local", what);
  m.state_mixing_mode = arg<std::string>(a, "state_mixing_mode", what);
  TORCH_CHECK(m.n_hidden > 0 && m.n_head > 0 && m.n_hidden % m.n_head == 0, "'", what,
              "': args.json 'n_hidden' (", m.n_hidden, ") must be a multiple of 'n_head' (",
              m.n_head, ")");
  TORCH_CHECK(m.radii.size() == m.neighbors_in_radius.size(), "'", what,
              "': args.json 'radii' and 'neighbors_in_radius' differ in length");
  TORCH_CHECK(m.state_mixing_mode == "weighted" || m.state_mixing_mode == "concat_project", "'",
              what, "': args.json 'state_mixing_mode' is '", m.state_mixing_mode,
              "', expected weighted or concat_project");
  return GeoTransolver(m).ptr();
}

struct Family {
  const char* name;
  std::vector<std::string> inputs;
  std::function<ModelPtr(const Config&, const ModelShape&)> build;
  const char* physicsnemo_class;
  std::function<ModelPtr(const nlohmann::json&, const std::string&)> from_args;
};

const std::vector<Family>& families() {
  static const std::vector<Family> all = {
      {"transolver", {"embedding", "fx"}, build_transolver, "Transolver", transolver_from_args},
      {"geotransolver",
       {"global_embedding", "geometry", "local_embedding", "local_positions"},
       build_geotransolver,
       "GeoTransolver",
       geotransolver_from_args},
  };
  return all;
}

}  // namespace

std::vector<std::string> model_family_names() {
  std::vector<std::string> out;
  for (const auto& f : families()) out.emplace_back(f.name);
  return out;
}

ModelPtr build_model(const Config& config, const ModelShape& shape) {
  const auto name = config.get<std::string>("model.name");
  for (const auto& f : families()) {
    if (name != f.name) continue;
    std::vector<std::string> given;
    for (const auto& [input, width] : shape.input_widths) given.push_back(input);
    std::vector<std::string> want = f.inputs;
    std::sort(want.begin(), want.end());
    TORCH_CHECK(given == want, "config: model '", name, "' reads the inputs ", join(f.inputs),
                "; 'model.inputs' gives ", join(given));
    TORCH_CHECK(shape.out_dim > 0, "config: the dataset declares no target fields");
    return f.build(config, shape);
  }
  TORCH_CHECK(false, "config: 'model.name' is '", name,
              "', expected one of: ", join(model_family_names()));
}

ModelPtr build_model_from_physicsnemo(const std::string& class_name, const nlohmann::json& args,
                                      const std::string& what) {
  std::vector<std::string> known;
  for (const auto& f : families()) {
    if (class_name == f.physicsnemo_class) return f.from_args(args, what);
    known.emplace_back(f.physicsnemo_class);
  }
  TORCH_CHECK(false, "'", what, "': model class '", class_name,
              "' is not one Slipstream builds; it builds: ", join(known));
}

std::vector<std::string> differing_args(const nlohmann::json& a, const nlohmann::json& b) {
  std::vector<std::string> out;
  for (const auto& [key, value] : a.items()) {
    if (!b.contains(key)) {
      out.push_back(key + ": " + value.dump() + " vs (absent)");
    } else if (!same_value(value, b.at(key))) {
      out.push_back(key + ": " + value.dump() + " vs " + b.at(key).dump());
    }
  }
  for (const auto& [key, value] : b.items()) {
    if (!a.contains(key)) out.push_back(key + ": (absent) vs " + value.dump());
  }
  return out;
}

}  // namespace slipstream::aero
