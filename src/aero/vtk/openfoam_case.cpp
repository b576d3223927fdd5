#include "aero/vtk/openfoam_case.h"

#include "aero/geometry/stl_file.h"
#include "aero/geometry/surface_mesh.h"
#include "aero/geometry/triangle_mesh.h"
#include "aero/vtk/raw_runs.h"
#include "aero/vtk/vtk_io.h"
#include "aero/vtk/vtu_writer.h"
#include "core/io/atomic_file.h"
#include "core/io/staged_directory.h"

#include <c10/util/Exception.h>
#include <fnmatch.h>
#include <torch/torch.h>
#include <vtkAppendPolyData.h>
#include <vtkCellCenters.h>
#include <vtkCellData.h>
#include <vtkCleanPolyData.h>
#include <vtkCompositeDataSet.h>
#include <vtkDataObjectTreeIterator.h>
#include <vtkDoubleArray.h>
#include <vtkDummyController.h>
#include <vtkInformation.h>
#include <vtkMultiBlockDataSet.h>
#include <vtkNew.h>
#include <vtkPOpenFOAMReader.h>
#include <vtkPointData.h>
#include <vtkPoints.h>
#include <vtkPolyData.h>
#include <vtkSmartPointer.h>
#include <vtkUnstructuredGrid.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

namespace slipstream::aero {

namespace fs = std::filesystem;

namespace {

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return out.empty() ? "none" : out;
}

// A directory name that is a time (0, 12, 0.25, 1e-05).
bool is_time_name(const std::string& name) {
  if (name.empty()) return false;
  char* end = nullptr;
  std::strtod(name.c_str(), &end);
  return end == name.c_str() + name.size();
}

bool has_times_beyond_zero(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    if (e.is_directory() && is_time_name(name) && std::strtod(name.c_str(), nullptr) != 0.0) {
      return true;
    }
  }
  return false;
}

bool decomposed(const fs::path& dir, const std::string& case_type) {
  TORCH_CHECK(case_type == "auto" || case_type == "reconstructed" || case_type == "decomposed",
              "prepare: --case-type '", case_type,
              "' is not one of auto, reconstructed, decomposed");
  if (case_type != "auto") return case_type == "decomposed";
  return fs::is_directory(dir / "processor0") && !has_times_beyond_zero(dir);
}

// The name a patch is selected by: VTK lists patches as "patch/NAME" (9.1:
// "NAME"), beside "internalMesh" and "lagrangian/...".
std::string patch_name(const std::string& array_name) {
  return array_name.rfind("patch/", 0) == 0 ? array_name.substr(6) : array_name;
}
bool is_patch(const std::string& array_name) {
  return array_name != "internalMesh" && array_name.rfind("lagrangian/", 0) != 0;
}

// The forceCoeffs function object's output: its references from the header
// (magUInf, lRef, Aref, dragDir) and, per time, its coefficients by name.
struct ForceCoeffs {
  std::string file;
  std::map<std::string, std::string> header;  // "magUInf" -> "1.0e+01"
  std::vector<std::string> columns;           // "Time", "Cd", ...
  std::map<double, std::vector<double>> rows;
};

std::vector<double> vector_of(const std::string& text) {  // "(1 0 0)"
  std::string t = text;
  for (char& c : t) {
    if (c == '(' || c == ')') c = ' ';
  }
  std::istringstream in(t);
  std::vector<double> v;
  for (double x; in >> x;) v.push_back(x);
  return v;
}

// Every postProcessing/forceCoeffs*/<start>/{coefficient,forceCoeffs}.dat
// of the case, rows of later starts (restarts) winning.
std::optional<ForceCoeffs> read_force_coeffs(const fs::path& case_dir) {
  const fs::path post = case_dir / "postProcessing";
  if (!fs::is_directory(post)) return std::nullopt;
  std::vector<fs::path> files;
  for (const auto& fo : fs::directory_iterator(post)) {
    if (!fo.is_directory() || fo.path().filename().string().rfind("forceCoeffs", 0) != 0) continue;
    for (const auto& start : fs::directory_iterator(fo.path())) {
      for (const char* name : {"coefficient.dat", "forceCoeffs.dat"}) {
        if (fs::is_regular_file(start.path() / name)) files.push_back(start.path() / name);
      }
    }
  }
  if (files.empty()) return std::nullopt;
  std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) {
    return std::strtod(a.parent_path().filename().c_str(), nullptr) <
           std::strtod(b.parent_path().filename().c_str(), nullptr);
  });
  ForceCoeffs out;
  for (const auto& f : files) {
    std::ifstream in(f);
    out.file = f.string();
    for (std::string line; std::getline(in, line);) {
      if (line.rfind('#', 0) == 0) {
        const auto colon = line.find(':');
        std::istringstream words(line.substr(1));
        std::string first;
        words >> first;
        if (colon != std::string::npos) {
          std::string value = line.substr(colon + 1);
          value.erase(0, value.find_first_not_of(" \t"));
          out.header[first] = value;
        } else if (first == "Time") {
          out.columns = {"Time"};
          for (std::string c; words >> c;) out.columns.push_back(c);
        }
        continue;
      }
      std::istringstream values(line);
      std::vector<double> row;
      for (double x; values >> x;) row.push_back(x);
      if (!row.empty() && row.size() == out.columns.size()) out.rows[row[0]] = row;
    }
  }
  TORCH_CHECK(!out.columns.empty(), "prepare: '", out.file,
              "' has no '# Time ...' header naming its columns");
  return out;
}

void put_force_coeffs(Sample& s, const ForceCoeffs& fc, double time) {
  auto header = [&](const char* key) -> std::string {
    auto it = fc.header.find(key);
    TORCH_CHECK(it != fc.header.end(), "prepare: '", fc.file, "' does not say its ", key);
    return it->second;
  };
  const double speed = std::stod(header("magUInf"));
  const auto drag = vector_of(header("dragDir"));
  TORCH_CHECK(drag.size() == 3, "prepare: '", fc.file, "' dragDir is not a vector");
  s.global_data["U_inf"] =
      torch::tensor({speed * drag[0], speed * drag[1], speed * drag[2]}, torch::kFloat);
  s.global_data["rho_inf"] = torch::tensor({1.0}, torch::kDouble);
  s.global_data["p_inf"] = torch::tensor({0.0}, torch::kDouble);
  s.global_data["L_ref"] = torch::tensor({std::stod(header("lRef"))}, torch::kDouble);
  s.global_data["A_ref"] = torch::tensor({std::stod(header("Aref"))}, torch::kDouble);
  // The row at the time read (within the times' own round-off).
  auto it = fc.rows.lower_bound(time - 1e-9 * std::max(1.0, std::abs(time)));
  if (it == fc.rows.end() || std::abs(it->first - time) > 1e-9 * std::max(1.0, std::abs(time))) {
    return;  // no coefficients at this time: none kept
  }
  for (size_t c = 0; c < fc.columns.size(); ++c) {
    for (const auto& [column, key] :
         {std::pair{"Cd", "CD_cfd"}, std::pair{"Cl", "CL_cfd"}, std::pair{"Cs", "CS_cfd"}}) {
      if (fc.columns[c] == column) {
        s.global_data[key] = torch::tensor({it->second[c]}, torch::kDouble);
      }
    }
  }
}

// The leaves of the reader's output: the body's patches (polygons) and the
// internal mesh's pieces (one per processor where not appended).
struct Pieces {
  std::vector<vtkSmartPointer<vtkPolyData>> patches;
  std::vector<vtkSmartPointer<vtkUnstructuredGrid>> cells;
};
Pieces leaves_of(vtkMultiBlockDataSet* output) {
  Pieces p;
  vtkNew<vtkDataObjectTreeIterator> it;
  it->SetDataSet(output);
  it->VisitOnlyLeavesOn();
  for (it->InitTraversal(); !it->IsDoneWithTraversal(); it->GoToNextItem()) {
    vtkDataObject* leaf = it->GetCurrentDataObject();
    if (auto* poly = vtkPolyData::SafeDownCast(leaf); poly && poly->GetNumberOfCells() > 0) {
      p.patches.emplace_back(poly);
    } else if (auto* grid = vtkUnstructuredGrid::SafeDownCast(leaf);
               grid && grid->GetNumberOfCells() > 0) {
      p.cells.emplace_back(grid);
    }
  }
  return p;
}

// The body's patches as one surface, the processors' copies of shared
// points merged (so that a closed body is closed).
vtkSmartPointer<vtkPolyData> merged_surface(const Pieces& pieces) {
  vtkNew<vtkAppendPolyData> append;
  for (const auto& p : pieces.patches) append->AddInputData(p);
  vtkNew<vtkCleanPolyData> clean;
  clean->SetInputConnection(append->GetOutputPort());
  clean->PointMergingOn();
  clean->SetTolerance(0.0);
  clean->ConvertPolysToLinesOff();
  clean->ConvertLinesToPointsOff();
  clean->ConvertStripsToPolysOff();
  clean->Update();
  vtkSmartPointer<vtkPolyData> out = clean->GetOutput();
  return out;
}

// The surface as triangles facing out of the body (for its SDF).
TriangleMesh body_triangles(const SurfaceMesh& mesh_in, const std::string& what) {
  SurfaceMesh mesh = mesh_in;
  if (check_surface(cell_geometry(mesh)).enclosed_volume < 0) flip_orientation(mesh);
  TriangleMesh t;
  t.name = what;
  const auto v = mesh.vertices.to(torch::kDouble).contiguous();
  const double* vp = v.data_ptr<double>();
  for (int64_t i = 0; i < v.size(0); ++i)
    t.vertices.push_back({vp[3 * i], vp[3 * i + 1], vp[3 * i + 2]});
  const auto off = mesh.offsets.contiguous();
  const auto conn = mesh.connectivity.contiguous();
  const int64_t* o = off.data_ptr<int64_t>();
  const int64_t* c = conn.data_ptr<int64_t>();
  for (int64_t cell = 0; cell < mesh.num_cells(); ++cell) {
    for (int64_t k = o[cell] + 1; k + 1 < o[cell + 1]; ++k)
      t.faces.push_back({c[o[cell]], c[k], c[k + 1]});
  }
  return t;
}

// Cell centres (the average of each cell's vertices) and cell fields of
// the internal mesh's pieces, in piece order.
void put_cells(Sample& s, const Pieces& pieces, const std::vector<std::string>& fields,
               std::map<std::string, torch::Tensor>& data, const std::string& what) {
  std::vector<torch::Tensor> centres;
  std::map<std::string, std::vector<torch::Tensor>> values;
  for (const auto& grid : pieces.cells) {
    vtkNew<vtkCellCenters> cc;
    cc->SetInputData(grid);
    cc->VertexCellsOff();
    cc->CopyArraysOff();
    cc->Update();
    vtkPoints* pts = cc->GetOutput()->GetPoints();
    const int64_t n = pts->GetNumberOfPoints();
    auto c = torch::empty({n, 3}, torch::kFloat);
    float* cp = c.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
      double x[3];
      pts->GetPoint(i, x);
      for (int k = 0; k < 3; ++k) cp[3 * i + k] = static_cast<float>(x[k]);
    }
    centres.push_back(c);
    for (const auto& f : fields) {
      vtkDataArray* a = grid->GetCellData()->GetArray(f.c_str());
      TORCH_CHECK(a != nullptr, "prepare: '", what, "' internal mesh has no cell field '", f, "'");
      values[f].push_back(tensor_of(a, what + " field '" + f + "'"));
    }
  }
  TORCH_CHECK(!centres.empty(), "prepare: '", what, "' has no internal mesh cells");
  s.point_data["points"] = torch::cat(centres);
  for (auto& [f, parts] : values) data[f] = torch::cat(parts);
}

}  // namespace

bool is_openfoam_case(const std::string& dir) {
  return fs::is_regular_file(fs::path(dir) / "system" / "controlDict");
}

std::map<std::string, std::string> openfoam_field_names() {
  return {{"velocity", "U"}, {"pressure", "p"}, {"nut", "nut"}, {"wss", "wallShearStress"}};
}

namespace {

// What one read of a case gives: the body's patches merged into one surface
// and, when asked for, the internal mesh's pieces, at the chosen time.
struct CaseRead {
  fs::path dir;
  std::string what;  // the case, for messages
  double time = 0;
  std::vector<std::string> body;  // the patches read
  SurfaceData surface;
  Pieces pieces;
  vtkSmartPointer<vtkPOpenFOAMReader> reader;  // owns the pieces' data
  vtkSmartPointer<vtkDummyController> controller;
};

CaseRead read_case(const std::string& case_dir, bool cells, const std::vector<std::string>& wanted,
                   const OpenFoamOptions& o) {
  TORCH_CHECK(is_openfoam_case(case_dir), "prepare: '", case_dir,
              "' is not an OpenFOAM case (no system/controlDict)");
  const fs::path dir = fs::absolute(case_dir);
  const bool split = decomposed(dir, o.case_type);
  const std::string what = case_dir + (split ? " (decomposed)" : " (reconstructed)");
  auto reader = vtkSmartPointer<vtkPOpenFOAMReader>::New();
  vtkNew<vtkDummyController> one_process;  // the reader asks its controller for the ranks
  reader->SetController(one_process);
  reader->SetCaseType(split ? vtkPOpenFOAMReader::DECOMPOSED_CASE
                            : vtkPOpenFOAMReader::RECONSTRUCTED_CASE);
  reader->SetFileName((dir / "system" / "controlDict").c_str());
  reader->SetCreateCellToPoint(0);  // the finite-volume values, not averaged to points
  reader->SetDecomposePolyhedra(0);
  reader->UpdateInformation();

  // The body's patches: every name or pattern must match one.
  std::vector<std::string> all_patches;
  for (int i = 0; i < reader->GetNumberOfPatchArrays(); ++i) {
    const std::string name = reader->GetPatchArrayName(i);
    if (is_patch(name)) all_patches.push_back(patch_name(name));
  }
  TORCH_CHECK(!o.patches.empty(), "prepare: '", what,
              "': name the body's patches (--patch NAME or a pattern such as 'body*'); the case "
              "has ",
              joined(all_patches));
  reader->DisableAllPatchArrays();
  std::vector<std::string> body;
  for (const auto& pattern : o.patches) {
    bool matched = false;
    for (int i = 0; i < reader->GetNumberOfPatchArrays(); ++i) {
      const std::string name = reader->GetPatchArrayName(i);
      if (is_patch(name) && fnmatch(pattern.c_str(), patch_name(name).c_str(), 0) == 0) {
        reader->SetPatchArrayStatus(name.c_str(), 1);
        body.push_back(patch_name(name));
        matched = true;
      }
    }
    TORCH_CHECK(matched, "prepare: '", what, "' has no patch '", pattern, "'; it has ",
                joined(all_patches));
  }
  if (cells) reader->SetPatchArrayStatus("internalMesh", 1);

  // The fields, under the case's names.
  std::vector<std::string> all_fields;
  all_fields.reserve(static_cast<size_t>(reader->GetNumberOfCellArrays()));
  for (int i = 0; i < reader->GetNumberOfCellArrays(); ++i) {
    all_fields.push_back(reader->GetCellArrayName(i));
  }
  reader->DisableAllCellArrays();
  reader->DisableAllPointArrays();
  reader->DisableAllLagrangianArrays();
  for (const auto& f : wanted) {
    TORCH_CHECK(std::find(all_fields.begin(), all_fields.end(), f) != all_fields.end(),
                "prepare: '", what, "' has no field '", f, "' (its fields: ", joined(all_fields),
                "; map a target to another with --field TARGET=NAME)");
    reader->SetCellArrayStatus(f.c_str(), 1);
  }

  // The time.
  vtkDoubleArray* times = reader->GetTimeValues();
  std::vector<double> have;
  for (vtkIdType i = 0; times != nullptr && i < times->GetNumberOfTuples(); ++i) {
    have.push_back(times->GetValue(i));
  }
  std::vector<std::string> have_names;
  for (double t : have) {
    std::ostringstream s;
    s << t;
    have_names.push_back(s.str());
  }
  TORCH_CHECK(!have.empty(), "prepare: '", what, "' has no time directory past 0 with fields");
  double time = have.back();
  if (o.time != "latest") {
    char* end = nullptr;
    const double want = std::strtod(o.time.c_str(), &end);
    TORCH_CHECK(end == o.time.c_str() + o.time.size() && !o.time.empty(), "prepare: --time '",
                o.time, "' is neither 'latest' nor a number");
    auto it = std::find_if(have.begin(), have.end(), [&](double t) {
      return std::abs(t - want) <= 1e-9 * std::max(1.0, std::abs(want));
    });
    TORCH_CHECK(it != have.end(), "prepare: '", what, "' has no time ", o.time,
                "; its times: ", joined(have_names));
    time = *it;
  }
  reader->UpdateTimeStep(time);
  auto* output = vtkMultiBlockDataSet::SafeDownCast(reader->GetOutputDataObject(0));
  TORCH_CHECK(output != nullptr, "prepare: VTK could not read '", what, "'");
  const Pieces pieces = leaves_of(output);
  TORCH_CHECK(!pieces.patches.empty(), "prepare: '", what, "' patches ", joined(body),
              " have no faces at time ", time);

  CaseRead r;
  r.dir = dir;
  r.what = what;
  r.time = time;
  r.body = body;
  r.surface = surface_of(merged_surface(pieces), what, wanted);
  r.pieces = pieces;
  r.reader = reader;
  r.controller = one_process;
  return r;
}

}  // namespace

Sample read_openfoam_case(const std::string& case_dir, const std::string& kind,
                          const FieldSchema& targets,
                          const std::map<std::string, std::string>& names, const OpenFoamOptions& o,
                          std::vector<std::string>* warnings) {
  TORCH_CHECK(kind == "surface" || kind == "volume", "prepare: kind '", kind,
              "' is not one of surface, volume");
  const auto file_fields = file_field_names(targets, names, openfoam_field_names());
  const auto wanted = field_names_in_file(file_fields);
  CaseRead r = read_case(case_dir, kind == "volume", wanted, o);
  const fs::path& dir = r.dir;
  const std::string& what = r.what;
  const double time = r.time;
  const auto& body = r.body;
  const Pieces& pieces = r.pieces;
  SurfaceData surface = std::move(r.surface);
  std::ostringstream id;
  id << case_dir << "@" << time;
  Sample s;
  if (kind == "surface") {
    s = surface_sample(std::move(surface), what, id.str(), targets, file_fields, warnings,
                       /*inward_expected=*/true);  // OpenFOAM's faces point out of the fluid
  } else {
    const TriangleMesh triangles = body_triangles(surface.mesh, what + " patches " + joined(body));
    const SignedDistance sdf(triangles);  // checks the body closes
    s.id = id.str();
    std::map<std::string, torch::Tensor> data;
    put_cells(s, pieces, wanted, data, what);
    torch::Tensor sdf_values, sdf_normals;
    sdf.query(s.point("points"), sdf_values, sdf_normals);
    s.point_data["sdf"] = sdf_values;
    s.point_data["sdf_normals"] = sdf_normals;
    put_targets(s, data, file_fields, targets, what);
  }
  const auto fc = read_force_coeffs(dir);
  if (fc) put_force_coeffs(s, *fc, time);
  if (fs::is_regular_file(dir / "metadata.json")) put_metadata(s, (dir / "metadata.json").string());
  TORCH_CHECK(s.has_global("U_inf"), "prepare: '", what,
              "' says nothing of its free stream: give it a forceCoeffs function object "
              "(postProcessing/forceCoeffs*) or a metadata.json with \"U_inf\": [ux, uy, uz]");
  check_prepared_sample(s, targets);
  return s;
}

void export_openfoam_case(const std::string& case_dir, const std::string& run_dir,
                          const std::map<std::string, std::string>& names, const OpenFoamOptions& o,
                          const RawRunExport& run) {
  TORCH_CHECK(run.volume_cells > 0, "export-case: --volume-cells must be > 0");
  TORCH_CHECK(!run.index.empty() && run.index.find('/') == std::string::npos,
              "export-case: the index '", run.index, "' cannot be a file name suffix");
  TORCH_CHECK(!fs::exists(run_dir) || (fs::is_directory(run_dir) && fs::is_empty(run_dir)),
              "export-case: '", run_dir, "' exists and is not an empty directory");
  // The references and the CFD's coefficients, as prepare reads them.
  const auto spec = [](const char* name, FieldType type) {
    FieldSpec f;
    f.name = name;
    f.type = type;
    return f;
  };
  const FieldSchema surface_targets(
      {spec("pressure", FieldType::kScalar), spec("wss", FieldType::kVector)});
  const Sample refs = read_openfoam_case(case_dir, "surface", surface_targets, names, o);
  const FieldSchema all_targets({spec("velocity", FieldType::kVector),
                                 spec("pressure", FieldType::kScalar),
                                 spec("nut", FieldType::kScalar), spec("wss", FieldType::kVector)});
  const auto in_case = file_field_names(all_targets, names, openfoam_field_names());
  const auto out_name = drivaerml_field_names();
  const auto wanted = field_names_in_file(in_case);
  CaseRead r = read_case(case_dir, /*cells=*/true, wanted, o);

  const std::string tmp = run_dir + ".partial";
  remove_tree(tmp);
  fs::create_directories(tmp);
  try {
    const FreeStream free_stream = refs.free_stream();
    const double q = free_stream.dynamic_pressure();
    TORCH_CHECK(q > 0, "export-case: '", r.what, "' has no free-stream speed");
    const auto& p = r.surface.cell_fields.at(in_case.at("pressure"));
    write_vtp(tmp + "/boundary_" + run.index + ".vtp", r.surface.mesh,
              {{out_name.at("pressure"), p},
               {out_name.at("wss"), r.surface.cell_fields.at(in_case.at("wss"))},
               {"CpMeanTrim", (p - free_stream.p) / q}});
    Sample cells;
    std::map<std::string, torch::Tensor> data;
    put_cells(cells, r.pieces, {in_case.at("velocity"), in_case.at("pressure"), in_case.at("nut")},
              data, r.what);
    const auto points = cells.point("points");
    const int64_t n = points.size(0), keep = std::min(n, run.volume_cells);
    auto generator = at::detail::createCPUGenerator(run.seed);
    const auto rows = torch::randperm(n, generator, torch::kLong).narrow(0, 0, keep);
    std::vector<std::pair<std::string, torch::Tensor>> fields;
    for (const char* target : {"velocity", "pressure", "nut"}) {
      fields.emplace_back(out_name.at(target), data.at(in_case.at(target)).index_select(0, rows));
    }
    write_vtu(tmp + "/volume_" + run.index + ".vtu", points.index_select(0, rows), fields);
    write_stl(tmp + "/drivaer_" + run.index + ".stl", body_triangles(r.surface.mesh, r.what));
    if (refs.has_global("CD_cfd")) {
      std::ostringstream csv;
      csv.precision(10);
      csv << "Cd,Cl,Cs\n"
          << refs.global_scalar("CD_cfd", 0.0) << "," << refs.global_scalar("CL_cfd", 0.0) << ","
          << refs.global_scalar("CS_cfd", 0.0) << "\n";
      write_file_atomically(tmp + "/force_mom_" + run.index + ".csv", csv.str());
    }
    for (const auto& e : fs::directory_iterator(r.dir)) {  // the body's parameters, as shipped
      const std::string name = e.path().filename().string();
      if (e.is_regular_file() && name.rfind("geo_ref", 0) == 0 && e.path().extension() == ".csv") {
        fs::copy_file(e.path(), tmp + "/geo_ref_" + run.index + ".csv");
        break;
      }
    }
    if (fs::is_regular_file(r.dir / "metadata.json")) {
      fs::copy_file(r.dir / "metadata.json", tmp + "/metadata.json");
    } else {
      const auto u = refs.global("U_inf").to(torch::kDouble);
      nlohmann::json meta{
          {"U_inf", {u[0].item<double>(), u[1].item<double>(), u[2].item<double>()}},
          {"rho_inf", free_stream.rho},
          {"p_inf", free_stream.p},
          {"L_ref", refs.global_scalar("L_ref", 0.0)},
          {"A_ref", refs.global_scalar("A_ref", 0.0)}};
      write_file_atomically(tmp + "/metadata.json", meta.dump(2) + "\n");
    }
    if (fs::exists(run_dir)) fs::remove(run_dir);  // empty, checked above
    fs::rename(tmp, run_dir);
  } catch (...) {
    remove_tree(tmp);
    throw;
  }
}

}  // namespace slipstream::aero
