#include "aero/vtk/raw_runs.h"

#include "aero/data/dataset.h"
#include "aero/geometry/triangle_mesh.h"
#include "aero/vtk/vtk_io.h"
#include "core/io/atomic_file.h"
#include "core/io/safetensors.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>

namespace slipstream::aero {

namespace fs = std::filesystem;

std::map<std::string, std::string> drivaerml_field_names() {
  return {{"velocity", "UMeanTrim"},
          {"pressure", "pMeanTrim"},
          {"nut", "nutMeanTrim"},
          {"wss", "wallShearStressMeanTrim"}};
}

namespace {
std::string only_file_with(const std::string& dir, const std::string& ext) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ext) found.push_back(e.path().string());
  }
  TORCH_CHECK(found.size() == 1, "prepare: run '", dir, "' must hold exactly one ", ext,
              " file, found ", found.size());
  return found.front();
}
}  // namespace

Sample read_raw_run(const std::string& run_dir, const FieldSchema& targets,
                    const std::map<std::string, std::string>& vtu_names) {
  TORCH_CHECK(fs::is_directory(run_dir), "prepare: run directory '", run_dir, "' does not exist");
  const std::string meta_path = run_dir + "/metadata.json";
  std::ifstream meta_in(meta_path);
  TORCH_CHECK(meta_in.good(), "prepare: '", meta_path, "' is missing");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(meta_in);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "prepare: '", meta_path, "' is not valid JSON: ", e.what());
  }
  TORCH_CHECK(meta.contains("U_inf") && meta["U_inf"].is_array() && meta["U_inf"].size() == 3,
              "prepare: '", meta_path, "' needs \"U_inf\": [ux, uy, uz]");
  const auto vtu = only_file_with(run_dir, ".vtu");
  const auto stl = only_file_with(run_dir, ".stl");
  const auto drivaerml = drivaerml_field_names();
  std::map<std::string, std::string> fields;  // target -> .vtu field
  for (const auto& f : targets.fields()) {
    auto given = vtu_names.find(f.name);
    auto known = drivaerml.find(f.name);
    fields[f.name] = given != vtu_names.end()   ? given->second
                     : known != drivaerml.end() ? known->second
                                                : f.name;
  }
  std::vector<std::string> names;
  for (const auto& [target, field] : fields) names.push_back(field);
  VolumeMesh volume = read_vtu(vtu, names);
  TriangleMesh surface = read_stl(stl);
  SignedDistance sdf(surface);  // checks the STL is watertight

  Sample s;
  s.id = run_dir;
  s.point_data["points"] = volume.points;
  torch::Tensor sdf_values, sdf_normals;
  sdf.query(volume.points, sdf_values, sdf_normals);
  s.point_data["sdf"] = sdf_values;
  s.point_data["sdf_normals"] = sdf_normals;
  const auto u = meta["U_inf"].get<std::vector<double>>();
  s.global_data["U_inf"] = torch::tensor({u[0], u[1], u[2]}, torch::kFloat);
  s.global_data["rho_inf"] = torch::tensor({meta.value("rho_inf", 1.0)}, torch::kDouble);
  s.global_data["p_inf"] = torch::tensor({meta.value("p_inf", 0.0)}, torch::kDouble);
  if (meta.contains("L_ref")) {
    s.global_data["L_ref"] = torch::tensor({meta["L_ref"].get<double>()}, torch::kDouble);
  }
  SampleLayout required;
  required.point_channels = {{"points", 3}, {"sdf", 1}, {"sdf_normals", 3}};
  required.global_sizes = {{"U_inf", 3}};
  for (const auto& f : targets.fields()) {
    const auto& field = fields.at(f.name);
    auto t = volume.fields.at(field);
    TORCH_CHECK(t.size(1) == f.channels(), "prepare: '", vtu, "' field '", field, "' has ",
                t.size(1), " components; target '", f.name, "' is a ", to_string(f.type),
                " and needs ", f.channels());
    s.point_data[f.name] = t;
    required.point_channels[f.name] = f.channels();
  }
  validate_sample(s, required, targets.names(), /*allow_nonfinite_targets=*/true);
  return s;
}

PrepareReport prepare_runs(const std::string& in_dir, const std::string& out_dir,
                           const PrepareOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  TORCH_CHECK(fs::is_directory(in_dir), "prepare: input directory '", in_dir, "' does not exist");
  TORCH_CHECK(o.val_fraction >= 0 && o.val_fraction < 1,
              "prepare: --val-fraction must be in [0, 1)");
  std::vector<std::string> runs;
  for (const auto& e : fs::directory_iterator(in_dir)) {
    if (e.is_directory()) runs.push_back(e.path().string());
  }
  std::sort(runs.begin(), runs.end());
  TORCH_CHECK(!runs.empty(), "prepare: '", in_dir, "' holds no run directories");
  fs::create_directories(out_dir);
  PrepareReport report;
  const int64_t n_val = static_cast<int64_t>(o.val_fraction * static_cast<double>(runs.size()));
  nlohmann::json manifest;
  manifest["format"] = "slipstream-samples-v1";
  manifest["source"] = fs::absolute(in_dir).string();
  manifest["train"] = nlohmann::json::array();
  manifest["val"] = nlohmann::json::array();
  for (size_t i = 0; i < runs.size(); ++i) {
    Sample s = read_raw_run(runs[i], o.targets, o.vtu_names);
    const std::string name = fs::path(runs[i]).filename().string() + ".safetensors";
    write_sample_file(out_dir + "/" + name, s);
    const bool val = static_cast<int64_t>(i) >= static_cast<int64_t>(runs.size()) - n_val;
    manifest[val ? "val" : "train"].push_back(name);
    (val ? report.val : report.train) += 1;
    report.points += s.num_points();
  }
  TORCH_CHECK(report.train > 0, "prepare: every run went to val; lower --val-fraction");
  write_file_atomically(out_dir + "/manifest.json", manifest.dump(2) + "\n");
  report.runs = static_cast<int64_t>(runs.size());
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

void write_synthetic_vtk_runs(const std::string& out_dir, const SyntheticOptions& options,
                              int64_t count) {
  TORCH_CHECK(count > 0, "make-synthetic: need at least one run");
  for (int64_t i = 0; i < count; ++i) {
    SyntheticSphere body;
    const Sample s = make_synthetic_sample(i, options, &body);
    char name[32];
    std::snprintf(name, sizeof(name), "run_%04lld", static_cast<long long>(i));
    const std::string dir = out_dir + "/" + name;
    fs::create_directories(dir);
    std::vector<std::pair<std::string, torch::Tensor>> fields;
    for (const auto& [target, vtu_name] : drivaerml_field_names()) {
      if (s.has_point(target)) fields.emplace_back(vtu_name, s.point(target));
    }
    write_vtu(dir + "/volume.vtu", s.point("points"), fields);
    write_stl(dir + "/body.stl", make_icosphere(body.radius, body.center, 4));
    const auto u = s.global("U_inf").to(torch::kDouble);
    nlohmann::json meta{{"U_inf", {u[0].item<double>(), u[1].item<double>(), u[2].item<double>()}},
                        {"rho_inf", 1.0},
                        {"p_inf", 0.0},
                        {"nu", 1.5e-5},
                        {"L_ref", 2.0 * body.radius}};
    write_file_atomically(dir + "/metadata.json", meta.dump(2) + "\n");
  }
}

}  // namespace slipstream::aero
