#include "aero/vtk/raw_runs.h"

#include "aero/data/dataset.h"
#include "aero/data/manifest.h"
#include "aero/data/sample_file.h"
#include "aero/forces/force_coefficients.h"
#include "aero/geometry/stl_file.h"
#include "aero/geometry/surface_mesh.h"
#include "aero/geometry/triangle_mesh.h"
#include "aero/vtk/vtk_io.h"
#include "aero/vtk/vtu_stream.h"
#include "aero/vtk/vtu_writer.h"
#include "core/io/atomic_file.h"
#include "core/io/progress.h"
#include "core/io/safetensors.h"
#include "core/io/staged_directory.h"
#include "core/process/pipeline.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace slipstream::aero {

namespace fs = std::filesystem;

std::map<std::string, std::string> drivaerml_field_names() {
  return {{"velocity", "UMeanTrim"},
          {"pressure", "pMeanTrim"},
          {"nut", "nutMeanTrim"},
          {"wss", "wallShearStressMeanTrim"}};
}

std::map<std::string, std::string> file_field_names(
    const FieldSchema& targets, const std::map<std::string, std::string>& given_names,
    const std::map<std::string, std::string>& defaults) {
  std::map<std::string, std::string> fields;
  for (const auto& f : targets.fields()) {
    auto given = given_names.find(f.name);
    auto known = defaults.find(f.name);
    fields[f.name] = given != given_names.end() ? given->second
                     : known != defaults.end()  ? known->second
                                                : f.name;
  }
  return fields;
}

std::vector<std::string> field_names_in_file(const std::map<std::string, std::string>& names) {
  std::vector<std::string> out;
  out.reserve(names.size());
  for (const auto& [target, field] : names) out.push_back(field);
  return out;
}

namespace {
std::string only_file_with(const std::string& dir, const std::string& ext) {
  std::vector<std::string> found;
  std::string other_kind;  // a surface's .vtp where a volume's .vtu was looked for, or back
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    if (e.path().extension() == ext) found.push_back(e.path().string());
    const auto x = e.path().extension();
    if ((ext == ".vtu" && x == ".vtp") || (ext == ".vtp" && x == ".vtu")) {
      other_kind = e.path().filename().string();
    }
  }
  std::string hint;
  if (found.empty() && !other_kind.empty()) {
    hint = ext == ".vtu" ? "; it holds " + other_kind +
                               ", a surface: for a surface run add dataset=prepared_surface"
                         : "; it holds " + other_kind +
                               ", a volume: for a volume run use a volume dataset "
                               "(dataset=prepared)";
  }
  TORCH_CHECK(found.size() == 1, "prepare: run '", dir, "' must hold exactly one ", ext,
              " file, found ", found.size(), hint);
  return found.front();
}

// The run's volume: its one .vtu, or the pieces DrivAerML ships it in
// (NAME.vtu.00.part, NAME.vtu.01.part, ...: numbered from 00 with no gap),
// in order.
std::vector<std::string> volume_pieces(const std::string& dir) {
  std::map<int, std::string> parts;
  std::string stem;
  size_t whole = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const auto name = e.path().filename().string();
    if (e.path().extension() == ".vtu") ++whole;
    const auto at = name.rfind(".vtu.");
    if (at == std::string::npos || e.path().extension() != ".part") continue;
    const std::string number = name.substr(at + 5, name.size() - at - 5 - 5);
    TORCH_CHECK(!number.empty() && number.find_first_not_of("0123456789") == std::string::npos,
                "prepare: '", e.path().string(), "' is not a numbered piece (NAME.vtu.NN.part)");
    TORCH_CHECK(stem.empty() || stem == name.substr(0, at), "prepare: run '", dir,
                "' holds pieces of two volumes: '", stem, "' and '", name.substr(0, at), "'");
    stem = name.substr(0, at);
    parts[std::stoi(number)] = e.path().string();
  }
  if (parts.empty()) return {only_file_with(dir, ".vtu")};
  TORCH_CHECK(whole == 0, "prepare: run '", dir, "' holds both a .vtu and pieces of '", stem,
              ".vtu'; keep one");
  std::vector<std::string> out;
  for (const auto& [index, path] : parts) {
    TORCH_CHECK(index == static_cast<int>(out.size()), "prepare: run '", dir, "': piece ",
                out.size(), " of '", stem, ".vtu' is missing (found up to ", parts.rbegin()->first,
                ")");
    out.push_back(path);
  }
  return out;
}

// The file in `dir` whose name starts with `prefix` and ends with `ext`,
// or "" when none; more than one is an error.
std::string optional_file(const std::string& dir, const std::string& prefix,
                          const std::string& ext) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    if (e.is_regular_file() && name.rfind(prefix, 0) == 0 && e.path().extension() == ext) {
      found.push_back(e.path().string());
    }
  }
  TORCH_CHECK(found.size() <= 1, "prepare: run '", dir, "' holds ", found.size(), " ", prefix, "*",
              ext, " files; expected at most one");
  return found.empty() ? "" : found.front();
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK(in.good(), "prepare: '", path, "' is missing");
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "prepare: '", path, "' is not valid JSON: ", e.what());
  }
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return s;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\"");
  const auto e = s.find_last_not_of(" \t\r\"");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// A CSV of a header row and one row of numbers (DrivAerML's geo_ref_i.csv,
// force_mom_i.csv): lower-cased column name -> value.
std::map<std::string, double> read_one_row_csv(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK(in.good(), "prepare: cannot read '", path, "'");
  std::string header, row;
  std::getline(in, header);
  std::getline(in, row);
  std::vector<std::string> names, values;
  for (std::stringstream ss(header); std::getline(ss, header, ',');) names.push_back(trim(header));
  for (std::stringstream ss(row); std::getline(ss, row, ',');) values.push_back(trim(row));
  TORCH_CHECK(!names.empty() && names.size() == values.size(), "prepare: '", path,
              "' must hold a header row and one row of as many values (", names.size(), " names, ",
              values.size(), " values)");
  std::map<std::string, double> out;
  for (size_t i = 0; i < names.size(); ++i) {
    try {
      size_t used = 0;
      out[lower(names[i])] = std::stod(values[i], &used);
      TORCH_CHECK(used == values[i].size(), "");
    } catch (...) {
      TORCH_CHECK(false, "prepare: '", path, "' column '", names[i], "' holds '", values[i],
                  "', not a number");
    }
  }
  return out;
}

void put_free_stream(Sample& s, const nlohmann::json& meta, const std::string& meta_path) {
  TORCH_CHECK(meta.contains("U_inf") && meta["U_inf"].is_array() && meta["U_inf"].size() == 3,
              "prepare: '", meta_path, "' needs \"U_inf\": [ux, uy, uz]");
  const auto u = meta["U_inf"].get<std::vector<double>>();
  s.global_data["U_inf"] = torch::tensor({u[0], u[1], u[2]}, torch::kFloat);
  s.global_data["rho_inf"] = torch::tensor({meta.value("rho_inf", 1.0)}, torch::kDouble);
  s.global_data["p_inf"] = torch::tensor({meta.value("p_inf", 0.0)}, torch::kDouble);
  for (const char* key : {"L_ref", "A_ref"}) {
    if (meta.contains(key)) {
      s.global_data[key] = torch::tensor({meta[key].get<double>()}, torch::kDouble);
    }
  }
  // Every other number is a parameter of the run (nu, an Ahmed body's slant
  // angle phi, ...): kept as a global, so that the training envelope spans it.
  // The CFD's own coefficients given here (e.g. averaged over the iterations
  // its fields were) win over a case's forceCoeffs row at the time read.
  for (const auto& [key, value] : meta.items()) {
    const bool cfd = key == "CD_cfd" || key == "CL_cfd" || key == "CS_cfd";
    if (value.is_number() && (cfd || !s.has_global(key))) {
      s.global_data[key] = torch::tensor({value.get<double>()}, torch::kDouble);
    }
  }
}

void warn(std::vector<std::string>* warnings, const std::string& message) {
  std::cerr << "prepare: warning: " << message << "\n";
  if (warnings != nullptr) warnings->push_back(message);
}
// The run's free stream and references: metadata.json where it has one,
// else DrivAerML's (with a warning) where that is allowed or the run has
// DrivAerML's geo_ref_i.csv; then lRef/aRef from geo_ref_i.csv and the
// CFD's own Cd/Cl/Cs from force_mom_i.csv.
void put_run_references(Sample& s, const std::string& run_dir, bool drivaerml_default,
                        std::vector<std::string>* warnings) {
  const std::string meta_path = run_dir + "/metadata.json";
  const auto geo = optional_file(run_dir, "geo_ref", ".csv");
  if (fs::is_regular_file(meta_path)) {
    put_free_stream(s, read_json(meta_path), meta_path);
  } else {
    TORCH_CHECK(drivaerml_default || !geo.empty(), "prepare: '", meta_path,
                "' is missing (and no geo_ref_*.csv marks the run as DrivAerML's)");
    warn(warnings, "'" + run_dir +
                       "' has no metadata.json: using DrivAerML's free stream, U_inf [38.89, 0, "
                       "0], rho_inf 1 (its pressures are kinematic, p / rho), p_inf 0");
    s.global_data["U_inf"] = torch::tensor({38.89, 0.0, 0.0}, torch::kFloat);
    s.global_data["rho_inf"] = torch::tensor({1.0}, torch::kDouble);
    s.global_data["p_inf"] = torch::tensor({0.0}, torch::kDouble);
  }
  if (!geo.empty()) {
    const auto row = read_one_row_csv(geo);
    for (const auto& [column, key] : {std::pair{"lref", "L_ref"}, std::pair{"aref", "A_ref"}}) {
      auto it = row.find(column);
      if (it != row.end() && !s.has_global(key)) {
        s.global_data[key] = torch::tensor({it->second}, torch::kDouble);
      }
    }
  }
  if (const auto forces = optional_file(run_dir, "force_mom", ".csv"); !forces.empty()) {
    const auto row = read_one_row_csv(forces);
    for (const auto& [column, key] :
         {std::pair{"cd", "CD_cfd"}, std::pair{"cl", "CL_cfd"}, std::pair{"cs", "CS_cfd"}}) {
      auto it = row.find(column);
      if (it != row.end()) s.global_data[key] = torch::tensor({it->second}, torch::kDouble);
    }
  }
}

}  // namespace

namespace {
// The rows a quick look keeps: a fixed random subset of `limit` of n, in
// file order; undefined when there is no limit or n is within it.
torch::Tensor limited_rows(int64_t n, int64_t limit) {
  if (limit <= 0 || limit >= n) return {};
  auto gen = at::detail::createCPUGenerator(20261201);
  return std::get<0>(torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kLong))
                         .narrow(0, 0, limit)
                         .sort());
}
}  // namespace

Sample read_raw_run(const std::string& run_dir, const FieldSchema& targets,
                    const std::map<std::string, std::string>& vtu_names, int64_t limit_points) {
  TORCH_CHECK(fs::is_directory(run_dir), "prepare: run directory '", run_dir, "' does not exist");
  const auto vtu = volume_pieces(run_dir);
  const auto stl = only_file_with(run_dir, ".stl");
  const auto fields = file_field_names(targets, vtu_names, drivaerml_field_names());
  const auto names = field_names_in_file(fields);
  VolumeMesh volume = read_vtu(vtu, names);
  if (const auto rows = limited_rows(volume.points.size(0), limit_points); rows.defined()) {
    volume.points = volume.points.index_select(0, rows);
    for (auto& [name, t] : volume.fields) t = t.index_select(0, rows);
  }
  TriangleMesh surface = read_stl(stl);
  SignedDistance sdf(surface);  // checks the STL is watertight

  Sample s;
  s.id = run_dir;
  s.point_data["points"] = volume.points;
  torch::Tensor sdf_values, sdf_normals;
  sdf.query(volume.points, sdf_values, sdf_normals);
  s.point_data["sdf"] = sdf_values;
  s.point_data["sdf_normals"] = sdf_normals;
  put_run_references(s, run_dir, /*drivaerml_default=*/false, nullptr);
  put_targets(s, volume.fields, fields, targets, vtu.front());
  check_prepared_sample(s, targets);
  return s;
}

int64_t stream_raw_run(const std::string& run_dir, const std::string& out_path,
                       const FieldSchema& targets,
                       const std::map<std::string, std::string>& vtu_names, int64_t limit_points,
                       std::string* why_not, int64_t block_rows,
                       const SampleWriteOptions& write_options,
                       const std::function<void(double)>& progress, StreamTimes* times) {
  TORCH_CHECK(fs::is_directory(run_dir), "prepare: run directory '", run_dir, "' does not exist");
  TORCH_CHECK(block_rows > 0, "prepare: block_rows must be positive");
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  StreamTimes spent;
  const VtuStream vtu(volume_pieces(run_dir));
  const auto fields = file_field_names(targets, vtu_names, drivaerml_field_names());
  std::string why = vtu.why_unsupported();
  for (const auto& [target, field] : fields) {
    if (why.empty() && vtu.is_cell_array(field) && !vtu.has_point_array(field)) {
      why = "field '" + field + "' is cell data (moved to the points by VTK's reader)";
    }
  }
  if (!why.empty()) {
    if (why_not != nullptr) *why_not = why;
    return -1;
  }
  const std::string& what = vtu.what();
  for (const auto& f : targets.fields()) {
    const auto& field = fields.at(f.name);
    TORCH_CHECK(vtu.has_point_array(field), "prepare: '", what, "' has no field '", field, "'");
    TORCH_CHECK(vtu.components(field) == f.channels(), "prepare: '", what, "' field '", field,
                "' has ", vtu.components(field), " components; target '", f.name, "' is a ",
                to_string(f.type), " and needs ", f.channels());
  }
  Sample globals;
  put_run_references(globals, run_dir, /*drivaerml_default=*/false, nullptr);
  TORCH_CHECK(globals.has_global("U_inf") && globals.global("U_inf").numel() == 3, "prepare: '",
              run_dir, "' gives no U_inf of 3 values");
  const SignedDistance sdf(read_stl(only_file_with(run_dir, ".stl")));
  spent.setup = since(t0);

  const int64_t n = vtu.points();
  const auto kept = limited_rows(n, limit_points);  // sorted; undefined: every row
  const int64_t rows = kept.defined() ? kept.size(0) : n;
  TORCH_CHECK(rows > 0, "prepare: '", what, "' has no points");
  std::vector<std::pair<std::string, int64_t>> columns = {
      {"points", 3}, {"sdf", 1}, {"sdf_normals", 3}};
  for (const auto& f : targets.fields()) columns.emplace_back(f.name, f.channels());
  SampleFileStreamWriter writer(out_path, rows, columns, write_options);
  std::map<std::string, std::unique_ptr<VtuStream::Cursor>> cursors;
  cursors["points"] = vtu.cursor("points");
  for (const auto& f : targets.fields()) cursors[f.name] = vtu.cursor(fields.at(f.name));
  // Reading block k + 1, the SDF of block k (on every core) and writing
  // block k - 1 overlap; each stage takes the blocks in order.
  struct Block {
    int64_t first = 0;
    torch::Tensor local;  // the kept rows that fall in this block; undefined: all
    std::map<std::string, torch::Tensor> fields;
  };
  int64_t next_kept = 0;
  run_pipeline<Block>(
      (n + block_rows - 1) / block_rows, 2,
      [&](int64_t k) {
        const auto start = Clock::now();
        Block b;
        b.first = k * block_rows;
        const int64_t count = std::min(block_rows, n - b.first);
        for (auto& [name, cursor] : cursors) b.fields[name] = cursor->next(count);
        if (kept.defined()) {
          const int64_t end =
              std::upper_bound(kept.data_ptr<int64_t>() + next_kept,
                               kept.data_ptr<int64_t>() + rows, b.first + count - 1) -
              kept.data_ptr<int64_t>();
          b.local = kept.narrow(0, next_kept, end - next_kept) - b.first;
          next_kept = end;
          for (auto& [name, t] : b.fields) t = t.index_select(0, b.local);
        }
        spent.read += since(start);
        return b;
      },
      [&](int64_t, Block& b) {
        const auto start = Clock::now();
        torch::Tensor d, normals;
        sdf.query(b.fields.at("points"), d, normals);
        for (const auto& [name, t] : {std::pair{"sdf", d}, std::pair{"sdf_normals", normals}}) {
          const auto finite = torch::isfinite(t).all(1);
          if (finite.all().item<bool>()) continue;
          const int64_t bad = torch::nonzero(~finite)[0][0].item<int64_t>();
          TORCH_CHECK(false, "prepare: '", what, "': the ", name, " of point ",
                      b.first + (b.local.defined() ? b.local[bad].item<int64_t>() : bad),
                      " is not finite (a degenerate STL?)");
        }
        b.fields["sdf"] = d;
        b.fields["sdf_normals"] = normals;
        spent.sdf += since(start);
      },
      [&](int64_t, Block& b) {
        const auto start = Clock::now();
        writer.append(b.fields);
        spent.append += since(start);
        const int64_t done = std::min(b.first + block_rows, n);
        if (progress) progress(static_cast<double>(done) / static_cast<double>(n));
      });
  const auto commit_start = Clock::now();
  writer.commit(run_dir, globals.global_data);
  spent.commit = since(commit_start);
  spent.wall = since(t0);
  if (times != nullptr) *times += spent;
  return rows;
}

StreamTimes& StreamTimes::operator+=(const StreamTimes& o) {
  setup += o.setup;
  read += o.read;
  sdf += o.sdf;
  append += o.append;
  commit += o.commit;
  wall += o.wall;
  return *this;
}

void put_targets(Sample& s, const std::map<std::string, torch::Tensor>& file_data,
                 const std::map<std::string, std::string>& file_fields, const FieldSchema& targets,
                 const std::string& what) {
  for (const auto& f : targets.fields()) {
    const auto& field = file_fields.at(f.name);
    auto it = file_data.find(field);
    TORCH_CHECK(it != file_data.end(), "prepare: '", what, "' has no field '", field, "'");
    TORCH_CHECK(it->second.size(1) == f.channels(), "prepare: '", what, "' field '", field,
                "' has ", it->second.size(1), " components; target '", f.name, "' is a ",
                to_string(f.type), " and needs ", f.channels());
    s.point_data[f.name] = it->second;
  }
}

Sample surface_sample(SurfaceData surface, const std::string& what, const std::string& id,
                      const FieldSchema& targets,
                      const std::map<std::string, std::string>& file_fields,
                      std::vector<std::string>* warnings, bool inward_expected) {
  CellGeometry g = cell_geometry(surface.mesh);
  SurfaceCheck check = check_surface(g);
  if (check.enclosed_volume < 0) {
    if (!inward_expected) {
      warn(warnings, "'" + what + "': the cell normals point inward (enclosed volume " +
                         std::to_string(check.enclosed_volume) + "); flipped to point outward");
    }
    flip_orientation(surface.mesh);
    g = cell_geometry(surface.mesh);
    check = check_surface(g);
  }
  if (check.degenerate_cells > 0) {
    warn(warnings, "'" + what + "': " + std::to_string(check.degenerate_cells) +
                       " cells have no area (zero normal; they add nothing to the forces)");
  }
  if (!check.closed(1e-4)) {
    warn(warnings, "'" + what + "': the surface is not closed (|sum of area vectors| / area = " +
                       std::to_string(check.closure) +
                       "); force coefficients over it include the open part's missing pressure");
  }
  Sample s;
  s.id = id;
  s.point_data["points"] = g.centroids.to(torch::kFloat);
  s.point_data["normals"] = g.normals.to(torch::kFloat);
  s.point_data["area"] = g.areas.to(torch::kFloat);
  put_targets(s, surface.cell_fields, file_fields, targets, what);
  s.mesh["vertices"] = surface.mesh.vertices.to(torch::kFloat);
  s.mesh["offsets"] = surface.mesh.offsets;
  s.mesh["connectivity"] = surface.mesh.connectivity;
  return s;
}

void check_prepared_sample(const Sample& s, const FieldSchema& targets) {
  SampleLayout required;
  if (s.has_point("normals")) {
    required.point_channels = {{"points", 3}, {"normals", 3}, {"area", 1}};
  } else {
    required.point_channels = {{"points", 3}, {"sdf", 1}, {"sdf_normals", 3}};
  }
  required.global_sizes = {{"U_inf", 3}};
  for (const auto& f : targets.fields()) required.point_channels[f.name] = f.channels();
  validate_sample(s, required, targets.names(), /*allow_nonfinite_targets=*/true);
}

void put_metadata(Sample& s, const std::string& meta_path) {
  put_free_stream(s, read_json(meta_path), meta_path);
}

Sample read_raw_surface_run(const std::string& run_dir, const FieldSchema& targets,
                            const std::map<std::string, std::string>& vtp_names,
                            std::vector<std::string>* warnings, int64_t limit_points) {
  TORCH_CHECK(fs::is_directory(run_dir), "prepare: run directory '", run_dir, "' does not exist");
  const auto vtp = only_file_with(run_dir, ".vtp");
  const auto fields = file_field_names(targets, vtp_names, drivaerml_field_names());
  const auto names = field_names_in_file(fields);
  SurfaceData surface = read_vtp(vtp, names);
  if (const auto rows = limited_rows(surface.mesh.num_cells(), limit_points); rows.defined()) {
    // Orientation and closure are then the kept cells' (a subset is open).
    surface.mesh = select_cells(surface.mesh, rows);
    for (auto& [name, t] : surface.cell_fields) t = t.index_select(0, rows);
  }
  Sample s = surface_sample(std::move(surface), vtp, run_dir, targets, fields, warnings,
                            /*inward_expected=*/false);
  put_run_references(s, run_dir, /*drivaerml_default=*/true, warnings);
  check_prepared_sample(s, targets);
  return s;
}

namespace {

// "run_2" before "run_10": digit runs compare as numbers.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      const auto na = a.substr(i, ie - i), nb = b.substr(j, je - j);
      const auto za = na.find_first_not_of('0'), zb = nb.find_first_not_of('0');
      const auto sa = za == std::string::npos ? "" : na.substr(za);
      const auto sb = zb == std::string::npos ? "" : nb.substr(zb);
      if (sa.size() != sb.size()) return sa.size() < sb.size();
      if (sa != sb) return sa < sb;
      i = ie;
      j = je;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

// Each run's split: from the splits manifest (a JSON dict of split -> run
// names) where one is given, else the last runs are test, the ones before
// them val, by the fractions.
std::vector<std::string> assign_splits(const std::vector<std::string>& runs,
                                       const PrepareOptions& o,
                                       std::vector<std::string>* warnings) {
  std::vector<std::string> split(runs.size());
  if (o.splits_manifest.empty()) {
    const auto n_runs = static_cast<int64_t>(runs.size());
    const auto n_val = static_cast<int64_t>(o.val_fraction * static_cast<double>(n_runs));
    const auto n_test = static_cast<int64_t>(o.test_fraction * static_cast<double>(n_runs));
    for (int64_t i = 0; i < n_runs; ++i) {
      const bool test = i >= n_runs - n_test;
      const bool val = !test && i >= n_runs - n_test - n_val;
      split[static_cast<size_t>(i)] = test ? "test" : val ? "val" : "train";
    }
    return split;
  }
  const Manifest m = read_manifest(o.splits_manifest);
  TORCH_CHECK(m.named_splits, "prepare: --splits '", o.splits_manifest,
              "' must be a JSON dict of split name -> run names, e.g. {\"train\": [\"run_1\"], "
              "\"val\": [\"run_2\"]}");
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < runs.size(); ++i) by_name[fs::path(runs[i]).filename().string()] = i;
  for (const auto& [name, entries] : m.splits) {
    for (const auto& entry : entries) {
      auto it = by_name.find(entry);
      TORCH_CHECK(it != by_name.end(), "prepare: --splits '", o.splits_manifest, "' split '", name,
                  "' names run '", entry, "', which is not a run directory of the input");
      TORCH_CHECK(split[it->second].empty(), "prepare: --splits '", o.splits_manifest,
                  "' puts run '", entry, "' in both '", split[it->second], "' and '", name, "'");
      split[it->second] = name;
    }
  }
  std::vector<std::string> left_out;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (split[i].empty()) left_out.push_back(fs::path(runs[i]).filename().string());
  }
  if (!left_out.empty()) {
    std::string names;
    for (const auto& n : left_out) names += (names.empty() ? "" : ", ") + n;
    warn(warnings, std::to_string(left_out.size()) + " runs are in no split of '" +
                       o.splits_manifest + "' and are not prepared: " + names);
  }
  return split;
}

}  // namespace

namespace {

// a is b or inside it.
bool is_under(const fs::path& a, const fs::path& b) {
  const auto rel = fs::weakly_canonical(a).lexically_relative(fs::weakly_canonical(b));
  return !rel.empty() && *rel.begin() != "..";
}

// --out must not hold --in or lie inside one of its runs, and must be new,
// empty or a dataset an earlier prepare wrote (it is replaced whole).
void check_prepare_output(const std::string& in_dir, const std::string& out_dir,
                          const std::vector<std::string>& runs) {
  TORCH_CHECK(!is_under(in_dir, out_dir), "prepare: --out '", out_dir, "' holds --in '", in_dir,
              "' and would replace it; write the prepared dataset elsewhere");
  for (const auto& run : runs) {
    TORCH_CHECK(!is_under(out_dir, run), "prepare: --out '", out_dir, "' is inside the run '", run,
                "'; write the prepared dataset elsewhere");
  }
  const fs::path out = fs::weakly_canonical(out_dir);
  if (!fs::exists(out)) return;
  TORCH_CHECK(fs::is_directory(out), "prepare: --out '", out_dir, "' is a file, not a directory");
  if (fs::is_empty(out)) return;
  const std::string manifest = (out / "manifest.json").string();
  bool ours = false;
  if (fs::is_regular_file(manifest)) {
    const auto j = nlohmann::json::parse(std::ifstream(manifest), nullptr, false);
    ours = j.is_object() && j.contains("format") && j["format"].is_string() &&
           is_sample_format(j["format"].get<std::string>());
  }
  TORCH_CHECK(ours, "prepare: --out '", out_dir,
              "' holds files that are not a dataset prepare wrote (no manifest.json of format ",
              kSampleFormat, "); it would be replaced whole, so give a new or empty directory");
}

}  // namespace

PrepareReport prepare_runs(const std::string& in_dir, const std::string& out_dir,
                           const PrepareOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  TORCH_CHECK(fs::is_directory(in_dir), "prepare: input directory '", in_dir, "' does not exist");
  TORCH_CHECK(o.val_fraction >= 0 && o.test_fraction >= 0 && o.val_fraction + o.test_fraction < 1,
              "prepare: --val-fraction and --test-fraction must be >= 0 and sum to less than 1");
  TORCH_CHECK(o.kind == "volume" || o.kind == "surface", "prepare: kind '", o.kind,
              "' is not one of volume, surface");
  TORCH_CHECK(o.format == "vtk" || o.format == "openfoam", "prepare: --format '", o.format,
              "' is not one of vtk, openfoam");
  const bool openfoam = o.format == "openfoam";
  std::vector<std::string> runs;
  if (openfoam && is_openfoam_case(in_dir)) {
    fs::path one = fs::absolute(in_dir).lexically_normal();  // --in is one case
    if (one.filename().empty()) one = one.parent_path();
    runs.push_back(one.string());
  } else {
    // Not --out itself, when it is in --in, nor its staging directories.
    const std::string out_name = fs::weakly_canonical(out_dir).filename().string();
    const auto is_output = [&](const fs::path& p) {
      const std::string name = p.filename().string();
      return fs::weakly_canonical(p).parent_path() == fs::weakly_canonical(out_dir).parent_path() &&
             (name == out_name || name.rfind(out_name + ".", 0) == 0);
    };
    for (const auto& e : fs::directory_iterator(in_dir)) {
      if (is_output(e.path())) continue;
      if (e.is_directory() && (!openfoam || is_openfoam_case(e.path().string()))) {
        runs.push_back(e.path().string());
      }
    }
  }
  std::sort(runs.begin(), runs.end(), [](const std::string& a, const std::string& b) {
    return natural_less(fs::path(a).filename().string(), fs::path(b).filename().string());
  });
  TORCH_CHECK(!runs.empty(), "prepare: '", in_dir, "' holds no ",
              openfoam ? "OpenFOAM case (a directory with system/controlDict)" : "run directories");
  check_prepare_output(in_dir, out_dir, runs);
  PrepareReport report;
  const std::vector<std::string> split = assign_splits(runs, o, &report.warnings);
  // Written into a staging directory and swapped in whole at the end: a
  // failure leaves an earlier dataset in --out as it was.
  StagedDirectory staged(out_dir);
  const std::string& stage = staged.staging();
  nlohmann::json manifest;
  manifest["format"] = kSampleFormat;
  manifest["source"] = fs::absolute(in_dir).string();
  manifest["train"] = nlohmann::json::array();
  manifest["val"] = nlohmann::json::array();
  int64_t n_prepared = 0;
  for (const auto& name : split) n_prepared += name.empty() ? 0 : 1;
  ProgressBar progress("prepare: " + std::to_string(n_prepared) + " runs", /*quiet_s=*/5.0);
  for (size_t i = 0; i < runs.size(); ++i) {
    if (split[i].empty()) continue;
    const auto& run = runs[i];
    const std::string name = fs::path(run).filename().string() + ".safetensors";
    // A volume streams from its .vtu a block at a time where the file allows.
    int64_t points = -1;
    if (!openfoam && o.kind == "volume" && o.stream_block_rows > 0) {
      std::string why;
      const double done = static_cast<double>(report.runs);
      points = stream_raw_run(
          run, stage + "/" + name, o.targets, o.vtu_names, o.limit_points, &why,
          o.stream_block_rows, {},
          [&](double f) { progress.update((done + 0.95 * f) / n_prepared); }, &report.stream);
      if (points >= 0) report.streamed += 1;
#ifndef SLIPSTREAM_WITH_VTK
      TORCH_CHECK(points >= 0, "prepare: '", run, "' cannot be streamed (", why,
                  ") and this build has no VTK to read it whole (install libvtk9-dev and "
                  "rebuild)");
#endif
      if (points < 0) {
        warn(&report.warnings,
             "'" + run + "' is read whole (its memory grows with its size): " + why);
      }
    }
    if (points < 0) {
      const Sample s =
          openfoam ? read_openfoam_case(run, o.kind, o.targets, o.vtu_names, o.openfoam,
                                        &report.warnings)
          : o.kind == "surface"
              ? read_raw_surface_run(run, o.targets, o.vtu_names, &report.warnings, o.limit_points)
              : read_raw_run(run, o.targets, o.vtu_names, o.limit_points);
      write_sample_file(stage + "/" + name, s);
      points = s.num_points();
    }
    if (!manifest.contains(split[i])) manifest[split[i]] = nlohmann::json::array();
    manifest[split[i]].push_back(name);
    record_checksum(manifest, stage, name);
    if (split[i] == "train") report.train += 1;
    if (split[i] == "val") report.val += 1;
    if (split[i] == "test") report.test += 1;
    report.points += points;
    report.runs += 1;
    progress.update(static_cast<double>(report.runs) / static_cast<double>(n_prepared));
  }
  TORCH_CHECK(report.train > 0,
              "prepare: no run is left for train; lower --val-fraction / --test-fraction, or name "
              "train runs in --splits");
  write_file_atomically(stage + "/manifest.json", manifest.dump(2) + "\n");
  staged.commit();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

namespace {
void write_synthetic_surface_runs(const std::string& out_dir, const SyntheticOptions& options,
                                  int64_t count) {
  const auto names = drivaerml_field_names();
  for (int64_t i = 0; i < count; ++i) {
    const Sample s = make_synthetic_surface_sample(i, options);
    const std::string id = std::to_string(i);
    const std::string dir = out_dir + "/run_" + id;
    fs::create_directories(dir);
    SurfaceMesh mesh;
    mesh.vertices = s.mesh.at("vertices");
    mesh.offsets = s.mesh.at("offsets");
    mesh.connectivity = s.mesh.at("connectivity");
    write_vtp(dir + "/boundary_" + id + ".vtp", mesh,
              {{names.at("pressure"), s.point("pressure")}, {names.at("wss"), s.point("wss")}});
    const auto u = s.global("U_inf").to(torch::kDouble);
    const Vec3 flow{u[0].item<double>(), u[1].item<double>(), u[2].item<double>()};
    const nlohmann::json meta{{"U_inf", flow}, {"rho_inf", 1.0}, {"p_inf", 0.0}};
    write_file_atomically(dir + "/metadata.json", meta.dump(2) + "\n");
    const double l_ref = s.global_scalar("L_ref", 1.0), a_ref = s.global_scalar("A_ref", 1.0);
    std::ostringstream geo;
    geo.precision(17);
    geo << "lRef,aRef\n" << l_ref << "," << a_ref << "\n";
    write_file_atomically(dir + "/geo_ref_" + id + ".csv", geo.str());
    // The CFD's own coefficients, as DrivAerML ships them: here the exact
    // fields' integral (q = |U|^2 / 2, rho 1).
    const double q = 0.5 * (flow[0] * flow[0] + flow[1] * flow[1] + flow[2] * flow[2]);
    ForceOptions fo;
    fo.shear = ShearConvention::kWallOnFluid;  // as make_synthetic_surface_sample stores it
    fo.reference_area = a_ref;
    fo.reference_length = l_ref;
    const auto c = force_coefficients(s.point("points"), s.point("normals"), s.point("area"),
                                      s.point("pressure") / q, s.point("wss") / q, flow, fo);
    std::ostringstream forces;
    forces.precision(10);
    forces << "Cd,Cl,Cs\n" << c.at("CD") << "," << c.at("CL") << "," << c.at("CS") << "\n";
    write_file_atomically(dir + "/force_mom_" + id + ".csv", forces.str());
  }
}
}  // namespace

void write_synthetic_vtk_runs(const std::string& out_dir, const SyntheticOptions& options,
                              int64_t count) {
  TORCH_CHECK(count > 0, "make-synthetic: need at least one run");
#ifndef SLIPSTREAM_WITH_VTK
  TORCH_CHECK(options.kind != "surface",
              "make-synthetic --format vtk: surface runs (.vtp) need VTK; this slipstream was "
              "built without it (install libvtk9-dev and rebuild)");
#endif
  if (options.kind == "surface") {
    write_synthetic_surface_runs(out_dir, options, count);
    return;
  }
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
