#include "aero/vtk/raw_runs.h"

#include "aero/data/dataset.h"
#include "aero/geometry/triangle_mesh.h"
#include "aero/vtk/vtk_io.h"
#include "core/io/safetensors.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>

namespace slipstream::aero {

namespace fs = std::filesystem;

std::map<std::string, std::string> default_field_names() {
  return {{"velocity", "UMeanTrim"}, {"pressure", "pMeanTrim"}, {"nut", "nutMeanTrim"}};
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

Sample read_raw_run(const std::string& run_dir, const std::map<std::string, std::string>& fields) {
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
  std::vector<std::string> names;
  for (const auto& [target, field] : fields) names.push_back(field);
  VolumeMesh volume = read_vtu(vtu, names);
  TriangleMesh surface = read_stl(stl);
  SignedDistance sdf(surface);  // checks the STL is watertight

  Sample s;
  s.id = run_dir;
  s.points = volume.points;
  sdf.query(s.points, s.sdf, s.sdf_normals);
  const auto u = meta["U_inf"].get<std::vector<double>>();
  s.u_inf = torch::tensor({u[0], u[1], u[2]}, torch::kFloat);
  s.rho_inf = meta.value("rho_inf", 1.0);
  s.p_inf = meta.value("p_inf", 0.0);
  for (const auto& [target, field] : fields) {
    auto t = volume.fields.at(field);
    const int64_t want = target == "velocity" ? 3 : 1;
    TORCH_CHECK(t.size(1) == want, "prepare: '", vtu, "' field '", field, "' has ", t.size(1),
                " components; target '", target, "' needs ", want);
    s.targets[target] = t;
  }
  std::vector<std::string> targets;
  for (const auto& [target, field] : fields) targets.push_back(target);
  validate_sample(s, targets);
  return s;
}

PrepareReport prepare_runs(const std::string& in_dir, const std::string& out_dir,
                           const PrepareOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  TORCH_CHECK(fs::is_directory(in_dir), "prepare: input directory '", in_dir, "' does not exist");
  TORCH_CHECK(o.val_fraction >= 0 && o.val_fraction < 1, "prepare: --val-fraction must be in [0, 1)");
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
    Sample s = read_raw_run(runs[i], o.fields);
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
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
    write_vtu(dir + "/volume.vtu", s.points,
              {{"UMeanTrim", s.targets.at("velocity")},
               {"pMeanTrim", s.targets.at("pressure")},
               {"nutMeanTrim", s.targets.at("nut")}});
    write_stl(dir + "/body.stl", make_icosphere(body.radius, body.center, 4));
    nlohmann::json meta{{"U_inf", {s.u_inf[0].item<double>(), s.u_inf[1].item<double>(),
                                   s.u_inf[2].item<double>()}},
                        {"rho_inf", 1.0},
                        {"p_inf", 0.0},
                        {"nu", 1.5e-5},
                        {"L_ref", 2.0 * body.radius}};
    write_file_atomically(dir + "/metadata.json", meta.dump(2) + "\n");
  }
}

}  // namespace slipstream::aero
