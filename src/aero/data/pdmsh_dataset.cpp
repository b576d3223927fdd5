#include "aero/data/pdmsh_dataset.h"

#include "aero/data/transforms.h"
#include "aero/geometry/surface_mesh.h"
#include "aero/geometry/triangle_mesh.h"
#include "core/io/tensordict_memmap.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fnmatch.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <functional>

namespace slipstream::aero {

namespace fs = std::filesystem;

std::vector<std::string> glob_relative(const std::string& root, const std::string& pattern) {
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t slash = pattern.find('/', start);
    const std::string part = pattern.substr(start, slash - start);
    if (!part.empty() && part != ".") parts.push_back(part);
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  std::vector<std::string> out;
  std::function<void(const std::string&, size_t)> walk = [&](const std::string& rel, size_t depth) {
    const std::string dir = rel.empty() ? root : root + "/" + rel;
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    for (const auto& name : names) {
      if (fnmatch(parts[depth].c_str(), name.c_str(), FNM_PERIOD) != 0) continue;
      const std::string child = rel.empty() ? name : rel + "/" + name;
      if (depth + 1 == parts.size()) {
        out.push_back(child);
      } else if (fs::is_directory(root + "/" + child)) {
        walk(child, depth + 1);
      }
    }
  };
  if (!parts.empty() && fs::is_directory(root)) walk("", 0);
  return out;
}

namespace {

std::string parent_dir(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

int64_t channels_of(const at::Tensor& t) { return t.dim() >= 2 ? t.size(1) : 1; }

at::Tensor as_point_field(const at::Tensor& t) {
  auto x = t.to(torch::kFloat);
  return x.dim() == 1 ? x.unsqueeze(1) : x;
}

// The case's globals (a DomainMesh's global_data), then those of `mesh`
// (a boundary's own) where the case has none of that name.
std::map<std::string, at::Tensor> globals_of(const MemmapTree& domain, const MemmapTree* mesh) {
  std::map<std::string, at::Tensor> out;
  auto add = [&](const MemmapTree& level) {
    if (!level.has_child("global_data")) return;
    for (const auto& [name, t] : level.child("global_data").tensors) {
      if (out.count(name)) continue;
      out[name] =
          name == "U_inf" ? t.to(torch::kFloat).reshape({-1}) : t.to(torch::kDouble).reshape({-1});
    }
  };
  add(domain);
  if (mesh != nullptr) add(*mesh);
  return out;
}

std::string renamed(const PdmshOptions& o, const std::string& key) {
  auto it = o.fields.find(key);
  return it == o.fields.end() ? key : it->second;
}

const MemmapTree& boundary_of(const MemmapTree& domain, const PdmshOptions& o) {
  TORCH_CHECK(domain.has_child("boundaries"), "dataset: '", domain.path,
              "' has no boundaries (a surface dataset reads boundaries/", o.boundary, ")");
  return domain.child("boundaries").child(o.boundary);
}

// The body a volume sample's SDF is measured to: the geometry file next to
// the sample, else the sample's own boundary; empty path when neither.
std::string geometry_file(const std::string& sample_path, const PdmshOptions& o) {
  if (o.geometry.empty()) return "";
  const std::string dir = parent_dir(sample_path);
  const auto found = glob_relative(dir, o.geometry);
  TORCH_CHECK(found.size() <= 1, "dataset: ", found.size(), " files match the geometry pattern '",
              o.geometry, "' next to '", sample_path, "' (", found.front(), ", ", found[1],
              ", ...); set dataset.pdmsh.geometry to pick one");
  return found.empty() ? "" : dir + "/" + found.front();
}

TriangleMesh triangle_mesh_of(const MemmapTree& mesh) {
  const auto points = mesh.tensor("points").to(torch::kDouble).contiguous();
  const auto cells = mesh.tensor("cells").to(torch::kLong).contiguous();
  TORCH_CHECK(points.dim() == 2 && points.size(1) == 3, "dataset: '", mesh.path,
              "' points must be (V, 3), not ", points.sizes());
  TORCH_CHECK(cells.dim() == 2 && cells.size(1) == 3, "dataset: '", mesh.path,
              "' must be a triangle mesh (cells (F, 3)), not cells ", cells.sizes());
  TriangleMesh out;
  out.name = mesh.path;
  const double* p = points.data_ptr<double>();
  for (int64_t v = 0; v < points.size(0); ++v)
    out.vertices.push_back({p[3 * v], p[3 * v + 1], p[3 * v + 2]});
  const int64_t* c = cells.data_ptr<int64_t>();
  for (int64_t f = 0; f < cells.size(0); ++f)
    out.faces.push_back({c[3 * f], c[3 * f + 1], c[3 * f + 2]});
  return out;
}

SurfaceMesh polygons_of(const at::Tensor& vertices, const at::Tensor& cells,
                        const std::string& name) {
  const int64_t k = cells.size(1);
  SurfaceMesh m;
  m.vertices = vertices.to(torch::kDouble);
  m.offsets = torch::arange(0, (cells.size(0) + 1) * k, k, torch::kLong);
  m.connectivity = cells.to(torch::kLong).reshape({-1});
  m.name = name;
  return m;
}

}  // namespace

PdmshDataset::PdmshDataset(std::string root, std::vector<std::string> samples, PdmshOptions options)
    : root_(std::move(root)), samples_(std::move(samples)), options_(std::move(options)) {
  TORCH_CHECK(options_.kind == "volume" || options_.kind == "surface",
              "dataset: pdmsh kind must be volume or surface, not '", options_.kind, "'");
}

Sample PdmshDataset::get(size_t index) const { return get(index, PointRequest{}); }

Sample PdmshDataset::get(size_t index, const PointRequest& request) const {
  TORCH_CHECK(index < samples_.size(), "dataset: index ", index, " out of range");
  const std::string file = path(index);
  const MemmapTree domain = read_tensordict_memmap(file);
  auto gen = at::detail::createCPUGenerator(request.seed);
  Sample s;
  s.id = file;
  if (options_.kind == "volume") {
    const MemmapTree& interior = domain.child("interior");
    const at::Tensor& points = interior.tensor("points");
    TORCH_CHECK(points.dim() == 2 && points.size(1) == 3, "dataset: '", interior.path,
                "' points must be (N, 3), not ", points.sizes());
    const int64_t n = points.size(0);
    const auto idx = subsample_indices(n, request.max_points, request.mode, gen);
    auto take = [&](const at::Tensor& x) { return idx.defined() ? x.index_select(0, idx) : x; };
    s.point_data["points"] = take(points).to(torch::kFloat).contiguous();
    if (idx.defined()) {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& mean = points_mean_[index];
      if (!mean.defined()) mean = points.to(torch::kDouble).mean(0);
      s.points_mean = mean;
    }
    if (interior.has_child("point_data")) {
      for (const auto& [key, t] : interior.child("point_data").tensors) {
        TORCH_CHECK(t.dim() >= 1 && t.size(0) == n, "dataset: '", interior.path, "' point_data '",
                    key, "' has ", t.dim() ? t.size(0) : 0, " rows, not ", n);
        s.point_data[renamed(options_, key)] = as_point_field(take(t));
      }
    }
    if (!s.has_point("sdf") || !s.has_point("sdf_normals")) {
      const std::string geometry = geometry_file(file, options_);
      const bool own = geometry.empty() && domain.has_child("boundaries") &&
                       domain.child("boundaries").has_child(options_.boundary);
      TORCH_CHECK(!geometry.empty() || own, "dataset: '", file,
                  "' needs a body for its SDF: no file matching '", options_.geometry,
                  "' next to it (dataset.pdmsh.geometry) and no boundaries/", options_.boundary);
      const std::string key =
          geometry.empty() ? file + "#boundaries/" + options_.boundary : geometry;
      const auto distance = body(key, [&] {
        return triangle_mesh_of(geometry.empty() ? boundary_of(domain, options_)
                                                 : read_tensordict_memmap(geometry));
      });
      at::Tensor sdf, normals;
      distance->query(s.point("points"), sdf, normals);
      s.point_data["sdf"] = sdf;
      s.point_data["sdf_normals"] = normals;
    }
    s.global_data = globals_of(domain, nullptr);
  } else {
    const MemmapTree& boundary = boundary_of(domain, options_);
    const at::Tensor& vertices = boundary.tensor("points");
    const at::Tensor& cells = boundary.tensor("cells");
    TORCH_CHECK(cells.dim() == 2 && cells.size(1) >= 3, "dataset: '", boundary.path,
                "' cells must be (C, k >= 3) polygons, not ", cells.sizes());
    const int64_t c = cells.size(0);
    const auto idx = subsample_indices(c, request.max_points, request.mode, gen);
    auto take = [&](const at::Tensor& x) { return idx.defined() ? x.index_select(0, idx) : x; };
    const bool flip = inward(index, vertices, cells, boundary.path);
    SurfaceMesh surface = polygons_of(vertices, idx.defined() ? take(cells) : cells, boundary.path);
    const CellGeometry g = cell_geometry(surface);
    s.point_data["points"] = g.centroids.to(torch::kFloat);
    s.point_data["normals"] = (flip ? -g.normals : g.normals).to(torch::kFloat);
    s.point_data["area"] = g.areas.to(torch::kFloat);
    if (boundary.has_child("cell_data")) {
      for (const auto& [key, t] : boundary.child("cell_data").tensors) {
        TORCH_CHECK(t.dim() >= 1 && t.size(0) == c, "dataset: '", boundary.path, "' cell_data '",
                    key, "' has ", t.dim() ? t.size(0) : 0, " rows, not ", c);
        s.point_data[renamed(options_, key)] = as_point_field(take(t));
      }
    }
    if (!idx.defined()) {  // the whole surface: keep its polygons for the .vtp
      if (flip) flip_orientation(surface);
      s.mesh["vertices"] = surface.vertices.to(torch::kFloat);
      s.mesh["offsets"] = surface.offsets;
      s.mesh["connectivity"] = surface.connectivity;
    }
    s.global_data = globals_of(domain, &boundary);
  }
  check_(s);
  return s;
}

std::shared_ptr<const SignedDistance> PdmshDataset::body(
    const std::string& key, const std::function<TriangleMesh()>& load) const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = bodies_.begin(); it != bodies_.end(); ++it) {
      if (it->key != key) continue;
      bodies_.splice(bodies_.begin(), bodies_, it);
      return it->distance;
    }
  }
  auto distance = std::make_shared<const SignedDistance>(load());
  std::lock_guard<std::mutex> lock(mutex_);
  ++bodies_built_;
  bodies_.push_front(Body{key, distance, distance->size_bytes()});
  size_t total = 0;
  for (auto it = bodies_.begin(); it != bodies_.end();) {
    total += it->bytes;
    // The newest stays even when it alone is over the bound.
    it = (total > options_.body_cache_bytes && it != bodies_.begin()) ? bodies_.erase(it)
                                                                      : std::next(it);
  }
  return distance;
}

int64_t PdmshDataset::bodies_built() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bodies_built_;
}

bool PdmshDataset::inward(size_t index, const at::Tensor& vertices, const at::Tensor& cells,
                          const std::string& name) const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = inward_.find(index);
    if (it != inward_.end()) return it->second;
  }
  // Orientation is a property of the whole surface: its enclosed volume.
  const bool in =
      check_surface(cell_geometry(polygons_of(vertices, cells, name))).enclosed_volume < 0;
  std::lock_guard<std::mutex> lock(mutex_);
  inward_[index] = in;
  return in;
}

SampleLayout PdmshDataset::layout_of_file(size_t index) const {
  const std::string file = path(index);
  const MemmapTree domain = read_tensordict_memmap(file);
  SampleLayout out;
  out.point_channels["points"] = 3;
  const MemmapTree* mesh = nullptr;
  const char* data = "point_data";
  if (options_.kind == "volume") {
    mesh = &domain.child("interior");
    (void)mesh->tensor("points");
    const bool own =
        domain.has_child("boundaries") && domain.child("boundaries").has_child(options_.boundary);
    if (!geometry_file(file, options_).empty() || own) {
      out.point_channels["sdf"] = 1;
      out.point_channels["sdf_normals"] = 3;
    }
  } else {
    mesh = &boundary_of(domain, options_);
    (void)mesh->tensor("points");
    (void)mesh->tensor("cells");
    out.point_channels["normals"] = 3;
    out.point_channels["area"] = 1;
    data = "cell_data";
  }
  if (mesh->has_child(data)) {
    for (const auto& [key, t] : mesh->child(data).tensors) {
      out.point_channels[renamed(options_, key)] = channels_of(t);
    }
  }
  for (const auto& [name, t] : globals_of(domain, options_.kind == "surface" ? mesh : nullptr)) {
    out.global_sizes[name] = t.numel();
  }
  return out;
}

std::string PdmshDataset::describe() const {
  return root_ + ": " + std::to_string(samples_.size()) + " " + options_.kind +
         " samples (.pdmsh, " + options_.pattern + ")";
}

SampleLayout PdmshDataset::layout() const {
  TORCH_CHECK(!samples_.empty(), "dataset: '", root_, "' lists no samples");
  return layout_of_file(0);
}

void PdmshDataset::check_headers() const {
  const std::string where = options_.kind == "volume"
                                ? "interior point_data"
                                : "boundaries/" + options_.boundary + " cell_data";
  for (size_t i = 0; i < samples_.size(); ++i) {
    const SampleLayout have = layout_of_file(i);
    for (const auto& [name, channels] : check_.required.point_channels) {
      if (have.point_channels.count(name)) continue;
      std::string in_file = name;
      for (const auto& [file_key, target] : options_.fields) {
        if (target == name) in_file = file_key;
      }
      std::string has;
      for (const auto& [n, c] : have.point_channels) has += (has.empty() ? "" : ", ") + n;
      TORCH_CHECK(false, "dataset: '", path(i), "' has no field '", in_file, "' in its ", where,
                  in_file != name ? " (the target '" + name + "', by dataset.pdmsh.fields)" : "",
                  "; the sample holds: ", has);
    }
    check_layout(have, check_, path(i));
  }
}

}  // namespace slipstream::aero
