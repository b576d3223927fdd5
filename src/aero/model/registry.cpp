#include "aero/model/registry.h"

#include "aero/model/transolver.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <functional>

namespace slipstream::aero {

namespace {

void check_positive(const std::string& key, int64_t v) {
  TORCH_CHECK(v > 0, "config: '", key, "' must be > 0, got ", v);
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
  for (const char* k :
       {"model.n_layers", "model.n_hidden", "model.n_head", "model.slice_num", "model.mlp_ratio"}) {
    check_positive(k, c.get<int64_t>(k));
  }
  TORCH_CHECK(m.n_hidden % m.n_head == 0, "config: 'model.n_hidden' (", m.n_hidden,
              ") must be divisible by 'model.n_head' (", m.n_head, ")");
  return Transolver(m).ptr();
}

struct Family {
  const char* name;
  std::vector<std::string> inputs;
  std::function<ModelPtr(const Config&, const ModelShape&)> build;
};

const std::vector<Family>& families() {
  static const std::vector<Family> all = {
      {"transolver", {"embedding", "fx"}, build_transolver},
  };
  return all;
}

std::string join(const std::vector<std::string>& xs) {
  std::string out;
  for (const auto& x : xs) out += (out.empty() ? "" : ", ") + x;
  return out;
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

}  // namespace slipstream::aero
