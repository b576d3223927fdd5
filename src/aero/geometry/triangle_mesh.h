// Triangle meshes (a vehicle's STL) and signed distances to them.
//
// SignedDistance builds a bounding-volume hierarchy over the triangles and,
// for each query point, finds the nearest point on the surface. The sign
// comes from the angle-weighted pseudo-normal of the nearest feature (face,
// edge or vertex; Baerentzen and Aanaes 2005), which is exact for a closed,
// consistently oriented mesh: positive outside, negative inside. The SDF
// normal is the unit vector from the nearest surface point to the query,
// flipped inside, so that it points along the distance's gradient.
#pragma once

#include <torch/types.h>

#include <array>
#include <string>
#include <vector>

namespace slipstream::aero {

struct TriangleMesh {
  std::vector<std::array<double, 3>> vertices;
  std::vector<std::array<int64_t, 3>> faces;
  std::string name;  // the file it came from, for messages
};

// Throws c10::Error naming the mesh if it is empty, has degenerate indices,
// or is not watertight (every edge shared by exactly two faces).
void check_watertight(const TriangleMesh& mesh);

// A UV sphere-like triangulation (subdivided icosahedron) of radius r.
TriangleMesh make_icosphere(double radius, const std::array<double, 3>& center, int subdivisions);

class SignedDistance {
 public:
  explicit SignedDistance(const TriangleMesh& mesh);
  // points (N,3) -> sdf (N,1) and normals (N,3), float32, on the CPU.
  void query(const torch::Tensor& points, torch::Tensor& sdf, torch::Tensor& normals) const;
  // The memory it holds: the mesh, the hierarchy and the pseudo-normals.
  size_t size_bytes() const;

 private:
  struct Node {
    std::array<double, 3> lo, hi;
    int32_t left = -1, right = -1;  // children, or -1 for a leaf
    int32_t begin = 0, end = 0;     // triangle range for a leaf
  };
  int32_t build(int32_t begin, int32_t end);
  void nearest(const double* p, double& best_d2, int64_t& best_face,
               std::array<double, 3>& best_point, int& feature) const;

  TriangleMesh mesh_;
  std::vector<int64_t> order_;  // triangle ids, permuted by the BVH
  std::vector<Node> nodes_;
  std::vector<std::array<double, 3>> face_normals_;                 // unit
  std::vector<std::array<double, 3>> vertex_normals_;               // angle-weighted
  std::vector<std::array<std::array<double, 3>, 3>> edge_normals_;  // per face, edges 01,12,20
};

}  // namespace slipstream::aero
