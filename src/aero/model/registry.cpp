#include "aero/model/registry.h"

#include "aero/model/geotransolver/geotransolver.h"
#include "aero/model/physicsnemo_args.h"
#include "aero/model/transolver/transolver.h"
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

// check_fits_in_memory's per_layer: GeoTransolver's GALE has self and cross
// attention.
ModelPtr build_transolver(const Config& c, const ModelShape& shape) {
  const auto options = transolver_options(c, shape);
  check_fits_in_memory(c, 1.0);
  return Transolver(options).ptr();
}

ModelPtr transolver_from_args(const nlohmann::json& args, const std::string& what) {
  return Transolver(transolver_options(args, what)).ptr();
}

ModelPtr build_geotransolver(const Config& c, const ModelShape& shape) {
  const auto options = geotransolver_options(c, shape);
  check_fits_in_memory(c, 2.0);
  return GeoTransolver(options).ptr();
}

ModelPtr geotransolver_from_args(const nlohmann::json& args, const std::string& what) {
  return GeoTransolver(geotransolver_options(args, what)).ptr();
}

// One row a family: its config name, the inputs it reads, how it is built
// from a config and from PhysicsNeMo's arguments, and its PhysicsNeMo class.
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
    } else if (!same_arg_value(value, b.at(key))) {
      out.push_back(key + ": " + value.dump() + " vs " + b.at(key).dump());
    }
  }
  for (const auto& [key, value] : b.items()) {
    if (!a.contains(key)) out.push_back(key + ": (absent) vs " + value.dump());
  }
  return out;
}

}  // namespace slipstream::aero
