#include "aero/geometry/surface_mesh.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <cmath>

namespace slipstream::aero {

CellGeometry cell_geometry(const SurfaceMesh& mesh) {
  TORCH_CHECK(mesh.vertices.defined() && mesh.vertices.dim() == 2 && mesh.vertices.size(1) == 3,
              "surface: '", mesh.name, "' has no (V, 3) vertices");
  const auto v = mesh.vertices.to(torch::kDouble).contiguous();
  const auto off = mesh.offsets.to(torch::kLong).contiguous();
  const auto ids = mesh.connectivity.to(torch::kLong).contiguous();
  const int64_t cells = mesh.num_cells(), nv = v.size(0);
  TORCH_CHECK(cells > 0, "surface: '", mesh.name, "' has no cells");
  const double* p = v.data_ptr<double>();
  const int64_t* o = off.data_ptr<int64_t>();
  const int64_t* c = ids.data_ptr<int64_t>();
  CellGeometry g;
  g.centroids = torch::zeros({cells, 3}, torch::kDouble);
  g.area_vectors = torch::zeros({cells, 3}, torch::kDouble);
  double* cen = g.centroids.data_ptr<double>();
  double* av = g.area_vectors.data_ptr<double>();
  for (int64_t k = 0; k < cells; ++k) {
    const int64_t begin = o[k], end = o[k + 1];
    TORCH_CHECK(end - begin >= 3 && begin >= 0 && end <= ids.numel(), "surface: '", mesh.name,
                "' cell ", k, " has ", end - begin, " vertices; a polygon needs 3 or more");
    for (int64_t j = begin; j < end; ++j) {
      TORCH_CHECK(c[j] >= 0 && c[j] < nv, "surface: '", mesh.name, "' cell ", k, " uses vertex ",
                  c[j], " of ", nv);
    }
    // Fan triangles (v0, vi, vi+1): their area vectors sum to the polygon's
    // and their area-weighted centroids give its centroid.
    const double* a = p + 3 * c[begin];
    double weight = 0;
    double cx = 0, cy = 0, cz = 0;
    for (int64_t j = begin + 1; j + 1 < end; ++j) {
      const double* b = p + 3 * c[j];
      const double* d = p + 3 * c[j + 1];
      const double e1[3] = {b[0] - a[0], b[1] - a[1], b[2] - a[2]};
      const double e2[3] = {d[0] - a[0], d[1] - a[1], d[2] - a[2]};
      const double n[3] = {0.5 * (e1[1] * e2[2] - e1[2] * e2[1]),
                           0.5 * (e1[2] * e2[0] - e1[0] * e2[2]),
                           0.5 * (e1[0] * e2[1] - e1[1] * e2[0])};
      av[3 * k] += n[0];
      av[3 * k + 1] += n[1];
      av[3 * k + 2] += n[2];
      const double w = std::sqrt(n[0] * n[0] + n[1] * n[1] + n[2] * n[2]);
      weight += w;
      cx += w * (a[0] + b[0] + d[0]) / 3;
      cy += w * (a[1] + b[1] + d[1]) / 3;
      cz += w * (a[2] + b[2] + d[2]) / 3;
    }
    if (weight > 0) {
      cen[3 * k] = cx / weight;
      cen[3 * k + 1] = cy / weight;
      cen[3 * k + 2] = cz / weight;
    } else {  // degenerate: the vertices' mean
      for (int64_t j = begin; j < end; ++j) {
        for (int q = 0; q < 3; ++q) cen[3 * k + q] += p[3 * c[j] + q] / (end - begin);
      }
    }
  }
  g.areas = g.area_vectors.norm(2, 1, true);
  g.normals = g.area_vectors / g.areas.clamp_min(1e-300);
  return g;
}

SurfaceCheck check_surface(const CellGeometry& g) {
  SurfaceCheck out;
  const double total = g.areas.sum().item<double>();
  const double mean = total / static_cast<double>(std::max<int64_t>(1, g.areas.size(0)));
  out.degenerate_cells = (g.areas <= 1e-14 * mean).sum().item<int64_t>();
  out.enclosed_volume = (g.centroids * g.area_vectors).sum().item<double>() / 3.0;
  out.closure = total > 0 ? g.area_vectors.sum(0).norm().item<double>() / total : 1.0;
  return out;
}

void flip_orientation(SurfaceMesh& mesh) {
  auto ids = mesh.connectivity.to(torch::kLong).contiguous().clone();
  const auto off = mesh.offsets.to(torch::kLong).contiguous();
  int64_t* c = ids.data_ptr<int64_t>();
  const int64_t* o = off.data_ptr<int64_t>();
  for (int64_t k = 0; k < mesh.num_cells(); ++k) std::reverse(c + o[k], c + o[k + 1]);
  mesh.connectivity = ids;
}

SurfaceMesh make_uv_sphere(double r, const std::array<double, 3>& center, int64_t n_theta,
                           int64_t n_phi) {
  TORCH_CHECK(n_theta >= 2 && n_phi >= 3, "surface: a UV sphere needs n_theta >= 2, n_phi >= 3");
  SurfaceMesh m;
  m.name = "uv sphere";
  // Vertices: the two poles, then n_theta - 1 rings of n_phi.
  const int64_t nv = 2 + (n_theta - 1) * n_phi;
  m.vertices = torch::empty({nv, 3}, torch::kDouble);
  auto v = m.vertices.accessor<double, 2>();
  auto put = [&](int64_t i, double theta, double phi) {
    v[i][0] = center[0] + r * std::sin(theta) * std::cos(phi);
    v[i][1] = center[1] + r * std::sin(theta) * std::sin(phi);
    v[i][2] = center[2] + r * std::cos(theta);
  };
  put(0, 0.0, 0.0);
  put(1, M_PI, 0.0);
  auto ring = [&](int64_t t, int64_t f) { return 2 + (t - 1) * n_phi + (f % n_phi); };
  for (int64_t t = 1; t < n_theta; ++t) {
    for (int64_t f = 0; f < n_phi; ++f) {
      put(ring(t, f), M_PI * static_cast<double>(t) / static_cast<double>(n_theta),
          2 * M_PI * static_cast<double>(f) / static_cast<double>(n_phi));
    }
  }
  std::vector<int64_t> offsets{0}, ids;
  auto cell = [&](std::initializer_list<int64_t> vs) {
    ids.insert(ids.end(), vs);
    offsets.push_back(static_cast<int64_t>(ids.size()));
  };
  // Counter-clockwise seen from outside: outward normals.
  for (int64_t f = 0; f < n_phi; ++f) cell({0, ring(1, f), ring(1, f + 1)});
  for (int64_t t = 1; t + 1 < n_theta; ++t) {
    for (int64_t f = 0; f < n_phi; ++f) {
      cell({ring(t, f), ring(t + 1, f), ring(t + 1, f + 1), ring(t, f + 1)});
    }
  }
  for (int64_t f = 0; f < n_phi; ++f) cell({1, ring(n_theta - 1, f + 1), ring(n_theta - 1, f)});
  m.offsets = torch::tensor(offsets, torch::kLong);
  m.connectivity = torch::tensor(ids, torch::kLong);
  return m;
}

SurfaceMesh select_cells(const SurfaceMesh& mesh, const torch::Tensor& ids_in) {
  const auto ids = ids_in.to(torch::kLong).contiguous();
  const auto offsets = mesh.offsets.contiguous();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t* conn = mesh.connectivity.contiguous().data_ptr<int64_t>();
  const int64_t n = ids.numel();
  std::vector<int64_t> new_offsets(static_cast<size_t>(n) + 1, 0), new_conn;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(id[i] >= 0 && id[i] < mesh.num_cells(), "surface: cell ", id[i], " of '", mesh.name,
                "' is out of range (", mesh.num_cells(), " cells)");
    new_conn.insert(new_conn.end(), conn + off[id[i]], conn + off[id[i] + 1]);
    new_offsets[static_cast<size_t>(i) + 1] = static_cast<int64_t>(new_conn.size());
  }
  SurfaceMesh out;
  out.vertices = mesh.vertices;
  out.offsets = torch::tensor(new_offsets, torch::kLong);
  out.connectivity = torch::tensor(new_conn, torch::kLong);
  out.name = mesh.name;
  return out;
}

}  // namespace slipstream::aero
