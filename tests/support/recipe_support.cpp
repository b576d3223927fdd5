#include "support/recipe_support.h"

#include "aero/data/synthetic.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

namespace slipstream::testing {

aero::InputSpec volume_inputs() {
  return aero::InputSpec(
      {{"embedding", {{"points", "sdf", "sdf_normals"}, ""}}, {"fx", {{"U_inf"}, "embedding"}}});
}

aero::TransolverOptions fixture_transolver_options(const SafetensorsFile& f) {
  const auto cfg = nlohmann::json::parse(f.metadata.at("config"));
  aero::TransolverOptions o;
  o.functional_dim = cfg["functional_dim"];
  o.embedding_dim = cfg["embedding_dim"];
  o.out_dim = cfg["out_dim"];
  o.n_layers = cfg["n_layers"];
  o.n_hidden = cfg["n_hidden"];
  o.n_head = cfg["n_head"];
  o.slice_num = cfg["slice_num"];
  o.mlp_ratio = cfg["mlp_ratio"];
  return o;
}

aero::GeoTransolverOptions fixture_geotransolver_options(const SafetensorsFile& f) {
  const auto cfg = nlohmann::json::parse(f.metadata.at("config"));
  aero::GeoTransolverOptions o;
  o.functional_dim = cfg["functional_dim"];
  o.out_dim = cfg["out_dim"];
  o.geometry_dim = cfg["geometry_dim"];
  o.global_dim = cfg["global_dim"];
  o.n_layers = cfg["n_layers"];
  o.n_hidden = cfg["n_hidden"];
  o.n_head = cfg["n_head"];
  o.slice_num = cfg["slice_num"];
  o.mlp_ratio = cfg["mlp_ratio"];
  o.include_local_features = cfg["include_local_features"];
  o.radii = cfg["radii"].get<std::vector<double>>();
  o.neighbors_in_radius = cfg["neighbors_in_radius"].get<std::vector<int64_t>>();
  o.n_hidden_local = cfg["n_hidden_local"];
  o.state_mixing_mode = cfg["state_mixing_mode"];
  return o;
}

aero::GeoTransolver fixture_geotransolver(const SafetensorsFile& f) {
  aero::GeoTransolver model(fixture_geotransolver_options(f));
  std::map<std::string, torch::Tensor> named(f.tensors.begin(), f.tensors.end());
  model->load_named(named, "param.");
  return model;
}

aero::FieldSchema surface_field_schema() {
  aero::FieldSpec p, w;
  p.name = "pressure";
  p.nondim = aero::Nondim::kPressure;
  w.name = "wss";
  w.type = aero::FieldType::kVector;
  w.nondim = aero::Nondim::kStress;
  return aero::FieldSchema({p, w});
}

aero::Sample synthetic_sample(int64_t index, int64_t points) {
  aero::SyntheticOptions o;
  o.points_per_sample = points;
  return aero::make_synthetic_sample(index, o);
}

aero::Config load_config(const std::vector<std::string>& overrides) {
  return aero::Config::load(std::string(SLIPSTREAM_SOURCE_DIR) + "/configs", overrides);
}

void expect_parameters_as_listed(const torch::nn::Module& model, const std::string& fixture) {
  std::ifstream in(fixtures_dir() + "/" + fixture);
  ASSERT_TRUE(in.good()) << "missing fixture " << fixture;
  std::vector<std::string> ours;
  int64_t total = 0;
  for (const auto& p : model.named_parameters()) {
    std::ostringstream line;
    line << p.key() << " [";
    for (int64_t i = 0; i < p.value().dim(); ++i) line << (i ? ", " : "") << p.value().size(i);
    line << "]";
    ours.push_back(line.str());
    total += p.value().numel();
  }
  size_t i = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("total ", 0) == 0) {
      EXPECT_EQ(std::stoll(line.substr(6)), total) << fixture;
      continue;
    }
    ASSERT_LT(i, ours.size()) << fixture << " lists more parameters; next: " << line;
    EXPECT_EQ(ours[i], line) << fixture << " line " << i + 1;
    ++i;
  }
  EXPECT_EQ(i, ours.size()) << "the model has parameters " << fixture << " does not list";
}

}  // namespace slipstream::testing
