#include "aero/geometry/triangle_mesh.h"

#include "aero/geometry/vec3.h"

#include "core/process/parallel.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace slipstream::aero {

namespace {
using V3 = vec3::Vec3;
using vec3::add;
using vec3::cross;
using vec3::dot;
using vec3::norm;
using vec3::scale;
using vec3::sub;
V3 unit(const V3& a) {
  const double n = norm(a);
  return n > 0 ? scale(a, 1.0 / n) : V3{0, 0, 0};
}

// Nearest point on triangle abc to p (Ericson, Real-Time Collision
// Detection, 5.1.5). feature: 0 face, 1..3 vertex a/b/c, 4..6 edge ab/bc/ca.
V3 closest_on_triangle(const V3& p, const V3& a, const V3& b, const V3& c, int& feature) {
  const V3 ab = sub(b, a), ac = sub(c, a), ap = sub(p, a);
  const double d1 = dot(ab, ap), d2 = dot(ac, ap);
  if (d1 <= 0 && d2 <= 0) return feature = 1, a;
  const V3 bp = sub(p, b);
  const double d3 = dot(ab, bp), d4 = dot(ac, bp);
  if (d3 >= 0 && d4 <= d3) return feature = 2, b;
  const double vc = d1 * d4 - d3 * d2;
  if (vc <= 0 && d1 >= 0 && d3 <= 0) {
    feature = 4;
    return add(a, scale(ab, d1 / (d1 - d3)));
  }
  const V3 cp = sub(p, c);
  const double d5 = dot(ab, cp), d6 = dot(ac, cp);
  if (d6 >= 0 && d5 <= d6) return feature = 3, c;
  const double vb = d5 * d2 - d1 * d6;
  if (vb <= 0 && d2 >= 0 && d6 <= 0) {
    feature = 6;
    return add(a, scale(ac, d2 / (d2 - d6)));
  }
  const double va = d3 * d6 - d5 * d4;
  if (va <= 0 && (d4 - d3) >= 0 && (d5 - d6) >= 0) {
    feature = 5;
    return add(b, scale(sub(c, b), (d4 - d3) / ((d4 - d3) + (d5 - d6))));
  }
  const double denom = 1.0 / (va + vb + vc);
  feature = 0;
  return add(a, add(scale(ab, vb * denom), scale(ac, vc * denom)));
}

double box_distance2(const double* p, const V3& lo, const V3& hi) {
  double d2 = 0;
  for (int k = 0; k < 3; ++k) {
    const double d = std::max({lo[k] - p[k], 0.0, p[k] - hi[k]});
    d2 += d * d;
  }
  return d2;
}
}  // namespace

void check_watertight(const TriangleMesh& mesh) {
  TORCH_CHECK(!mesh.faces.empty(), "geometry: '", mesh.name, "' has no triangles");
  std::map<std::pair<int64_t, int64_t>, int> edges;
  const int64_t nv = static_cast<int64_t>(mesh.vertices.size());
  for (const auto& f : mesh.faces) {
    for (int k = 0; k < 3; ++k) {
      TORCH_CHECK(f[k] >= 0 && f[k] < nv, "geometry: '", mesh.name, "' has a face with vertex ",
                  f[k], " of ", nv);
      const int64_t a = f[k], b = f[(k + 1) % 3];
      TORCH_CHECK(a != b, "geometry: '", mesh.name, "' has a degenerate triangle");
      ++edges[{std::min(a, b), std::max(a, b)}];
    }
  }
  int64_t open = 0;
  for (const auto& [e, n] : edges) open += n != 2 ? 1 : 0;
  TORCH_CHECK(open == 0, "geometry: '", mesh.name, "' is not watertight: ", open, " of ",
              edges.size(), " edges are not shared by exactly two triangles");
}

TriangleMesh make_icosphere(double r, const std::array<double, 3>& center, int subdivisions) {
  const double t = (1.0 + std::sqrt(5.0)) / 2.0;
  std::vector<V3> v = {{-1, t, 0},  {1, t, 0},  {-1, -t, 0}, {1, -t, 0}, {0, -1, t},  {0, 1, t},
                       {0, -1, -t}, {0, 1, -t}, {t, 0, -1},  {t, 0, 1},  {-t, 0, -1}, {-t, 0, 1}};
  std::vector<std::array<int64_t, 3>> f = {
      {0, 11, 5},  {0, 5, 1},  {0, 1, 7},  {0, 7, 10}, {0, 10, 11}, {1, 5, 9}, {5, 11, 4},
      {11, 10, 2}, {10, 7, 6}, {7, 1, 8},  {3, 9, 4},  {3, 4, 2},   {3, 2, 6}, {3, 6, 8},
      {3, 8, 9},   {4, 9, 5},  {2, 4, 11}, {6, 2, 10}, {8, 6, 7},   {9, 8, 1}};
  for (auto& p : v) p = unit(p);
  for (int s = 0; s < subdivisions; ++s) {
    std::map<std::pair<int64_t, int64_t>, int64_t> mid;
    auto midpoint = [&](int64_t a, int64_t b) {
      const auto key = std::make_pair(std::min(a, b), std::max(a, b));
      auto it = mid.find(key);
      if (it != mid.end()) return it->second;
      v.push_back(unit(scale(add(v[a], v[b]), 0.5)));
      return mid[key] = static_cast<int64_t>(v.size()) - 1;
    };
    std::vector<std::array<int64_t, 3>> next;
    for (const auto& tri : f) {
      const int64_t a = midpoint(tri[0], tri[1]), b = midpoint(tri[1], tri[2]),
                    c = midpoint(tri[2], tri[0]);
      next.push_back({tri[0], a, c});
      next.push_back({tri[1], b, a});
      next.push_back({tri[2], c, b});
      next.push_back({a, b, c});
    }
    f = std::move(next);
  }
  TriangleMesh m;
  m.name = "icosphere";
  for (const auto& p : v) m.vertices.push_back(add(scale(p, r), center));
  m.faces = f;
  return m;
}

SignedDistance::SignedDistance(const TriangleMesh& mesh) : mesh_(mesh) {
  check_watertight(mesh_);
  const size_t nf = mesh_.faces.size();
  face_normals_.resize(nf);
  vertex_normals_.assign(mesh_.vertices.size(), V3{0, 0, 0});
  std::map<std::pair<int64_t, int64_t>, V3> edge_sum;
  for (size_t i = 0; i < nf; ++i) {
    const auto& f = mesh_.faces[i];
    const V3 &a = mesh_.vertices[f[0]], &b = mesh_.vertices[f[1]], &c = mesh_.vertices[f[2]];
    const V3 n = unit(cross(sub(b, a), sub(c, a)));
    face_normals_[i] = n;
    for (int k = 0; k < 3; ++k) {
      const V3& p = mesh_.vertices[f[k]];
      const V3 e1 = unit(sub(mesh_.vertices[f[(k + 1) % 3]], p));
      const V3 e2 = unit(sub(mesh_.vertices[f[(k + 2) % 3]], p));
      const double angle = std::acos(std::clamp(dot(e1, e2), -1.0, 1.0));
      vertex_normals_[f[k]] = add(vertex_normals_[f[k]], scale(n, angle));
      const int64_t u = f[k], w = f[(k + 1) % 3];
      auto& s = edge_sum[{std::min(u, w), std::max(u, w)}];
      s = add(s, n);
    }
  }
  edge_normals_.resize(nf);
  for (size_t i = 0; i < nf; ++i) {
    const auto& f = mesh_.faces[i];
    for (int k = 0; k < 3; ++k) {
      const int64_t u = f[k], w = f[(k + 1) % 3];
      edge_normals_[i][k] = edge_sum[{std::min(u, w), std::max(u, w)}];
    }
  }
  order_.resize(nf);
  for (size_t i = 0; i < nf; ++i) order_[i] = static_cast<int64_t>(i);
  nodes_.reserve(2 * nf / 4 + 2);
  build(0, static_cast<int32_t>(nf));
}

int32_t SignedDistance::build(int32_t begin, int32_t end) {
  Node node;
  node.lo = {INFINITY, INFINITY, INFINITY};
  node.hi = {-INFINITY, -INFINITY, -INFINITY};
  for (int32_t i = begin; i < end; ++i) {
    for (int64_t vi : mesh_.faces[order_[i]]) {
      for (int k = 0; k < 3; ++k) {
        node.lo[k] = std::min(node.lo[k], mesh_.vertices[vi][k]);
        node.hi[k] = std::max(node.hi[k], mesh_.vertices[vi][k]);
      }
    }
  }
  const int32_t index = static_cast<int32_t>(nodes_.size());
  nodes_.push_back(node);
  if (end - begin <= 4) {
    nodes_[index].begin = begin;
    nodes_[index].end = end;
    return index;
  }
  int axis = 0;
  for (int k = 1; k < 3; ++k) {
    if (node.hi[k] - node.lo[k] > node.hi[axis] - node.lo[axis]) axis = k;
  }
  auto centroid = [&](int64_t f) {
    const auto& t = mesh_.faces[f];
    return mesh_.vertices[t[0]][axis] + mesh_.vertices[t[1]][axis] + mesh_.vertices[t[2]][axis];
  };
  const int32_t mid = begin + (end - begin) / 2;
  std::nth_element(order_.begin() + begin, order_.begin() + mid, order_.begin() + end,
                   [&](int64_t a, int64_t b) { return centroid(a) < centroid(b); });
  const int32_t left = build(begin, mid);
  const int32_t right = build(mid, end);
  nodes_[index].left = left;
  nodes_[index].right = right;
  return index;
}

void SignedDistance::nearest(const double* p, double& best_d2, int64_t& best_face, V3& best_point,
                             int& feature) const {
  int32_t stack[128];
  int top = 0;
  stack[top++] = 0;
  const V3 q{p[0], p[1], p[2]};
  while (top > 0) {
    const Node& n = nodes_[stack[--top]];
    if (box_distance2(p, n.lo, n.hi) >= best_d2) continue;
    if (n.left < 0) {
      for (int32_t i = n.begin; i < n.end; ++i) {
        const auto& f = mesh_.faces[order_[i]];
        int feat = 0;
        const V3 c = closest_on_triangle(q, mesh_.vertices[f[0]], mesh_.vertices[f[1]],
                                         mesh_.vertices[f[2]], feat);
        const V3 d = sub(q, c);
        const double d2 = dot(d, d);
        if (d2 < best_d2) {
          best_d2 = d2;
          best_face = order_[i];
          best_point = c;
          feature = feat;
        }
      }
      continue;
    }
    const Node &l = nodes_[n.left], &r = nodes_[n.right];
    const double dl = box_distance2(p, l.lo, l.hi), dr = box_distance2(p, r.lo, r.hi);
    // Push the farther child first so the nearer is searched first.
    if (dl < dr) {
      stack[top++] = n.right;
      stack[top++] = n.left;
    } else {
      stack[top++] = n.left;
      stack[top++] = n.right;
    }
    TORCH_INTERNAL_ASSERT(top < 126, "BVH deeper than the query stack");
  }
}

void SignedDistance::query(const torch::Tensor& points_in, torch::Tensor& sdf,
                           torch::Tensor& normals) const {
  const auto points = points_in.to(torch::kDouble).contiguous();
  TORCH_CHECK(points.dim() == 2 && points.size(1) == 3, "geometry: query points must be (N, 3)");
  const int64_t n = points.size(0);
  auto out_sdf = torch::empty({n, 1}, torch::kDouble);
  auto out_normal = torch::empty({n, 3}, torch::kDouble);
  const double* pp = points.data_ptr<double>();
  double* ps = out_sdf.data_ptr<double>();
  double* pn = out_normal.data_ptr<double>();
  parallel_ranges(n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const double* p = pp + 3 * i;
      double best = std::numeric_limits<double>::infinity();
      int64_t face = -1;
      V3 c{0, 0, 0};
      int feature = 0;
      nearest(p, best, face, c, feature);
      const auto& f = mesh_.faces[face];
      V3 pseudo;
      if (feature == 0)
        pseudo = face_normals_[face];
      else if (feature <= 3)
        pseudo = vertex_normals_[f[feature - 1]];
      else
        pseudo = edge_normals_[face][feature - 4];
      const V3 d = sub(V3{p[0], p[1], p[2]}, c);
      const double dist = std::sqrt(best);
      const double sign = dot(d, pseudo) >= 0 ? 1.0 : -1.0;
      const V3 dir = dist > 1e-12 ? scale(d, sign / dist) : unit(pseudo);
      ps[i] = sign * dist;
      pn[3 * i] = dir[0];
      pn[3 * i + 1] = dir[1];
      pn[3 * i + 2] = dir[2];
    }
  });
  sdf = out_sdf.to(torch::kFloat);
  normals = out_normal.to(torch::kFloat);
}

size_t SignedDistance::size_bytes() const {
  return mesh_.vertices.size() * sizeof(mesh_.vertices[0]) +
         mesh_.faces.size() * sizeof(mesh_.faces[0]) + order_.size() * sizeof(order_[0]) +
         nodes_.size() * sizeof(Node) + face_normals_.size() * sizeof(face_normals_[0]) +
         vertex_normals_.size() * sizeof(vertex_normals_[0]) +
         edge_normals_.size() * sizeof(edge_normals_[0]);
}

}  // namespace slipstream::aero
