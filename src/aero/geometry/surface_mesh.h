// Polygon surfaces (a vehicle's boundary: DrivAerML's boundary_i.vtp, mostly
// quads) and the per-cell geometry surface models and forces need.
//
// SurfaceMesh holds vertices and polygons (offsets into a flat list of
// vertex ids, as VTK stores them). cell_geometry() gives, per cell, the
// area vector (half the sum of the edge cross products: exact for planar
// polygons, the mean plane otherwise), its length (the area), the unit
// normal and the area-weighted centroid of its fan triangles.
//
// check_surface() reports what forces need to hold: cells with no area,
// normals that point inward (the enclosed volume by the divergence theorem,
// sum_c x_c . A_c / 3, is negative; orient_outward() flips them), and a
// surface that is not closed (the area vectors of a closed surface sum to
// zero).
#pragma once

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace slipstream::aero {

struct SurfaceMesh {
  torch::Tensor vertices;      // (V, 3) float64
  torch::Tensor offsets;       // (C + 1) int64: cell c is connectivity[offsets[c]:offsets[c+1]]
  torch::Tensor connectivity;  // (sum of cell sizes) int64 vertex ids
  std::string name;            // the file it came from, for messages

  int64_t num_cells() const { return offsets.defined() ? offsets.size(0) - 1 : 0; }
};

struct CellGeometry {
  torch::Tensor centroids;     // (C, 3) float64
  torch::Tensor normals;       // (C, 3) float64, unit (zero for a degenerate cell)
  torch::Tensor areas;         // (C, 1) float64
  torch::Tensor area_vectors;  // (C, 3) float64: area * normal
};

// Throws naming the mesh for a cell of fewer than 3 vertices or an id out
// of range.
CellGeometry cell_geometry(const SurfaceMesh& mesh);

struct SurfaceCheck {
  int64_t degenerate_cells = 0;  // area <= 1e-14 of the mean cell area
  double enclosed_volume = 0;    // negative: the normals point inward
  double closure = 0;            // |sum of area vectors| / sum of areas: 0 when closed
  bool closed(double tolerance = 1e-6) const { return closure <= tolerance; }
};
SurfaceCheck check_surface(const CellGeometry& geometry);

// The cells `ids` (int64, any order) of `mesh`, in that order, with all of
// its vertices.
SurfaceMesh select_cells(const SurfaceMesh& mesh, const torch::Tensor& ids);

// Reverses every cell's vertex order (its normal flips).
void flip_orientation(SurfaceMesh& mesh);

// A UV sphere of radius r: n_theta rings of quads between the poles and a
// fan of triangles at each pole, n_phi cells around; outward normals.
SurfaceMesh make_uv_sphere(double radius, const std::array<double, 3>& center, int64_t n_theta,
                           int64_t n_phi);

}  // namespace slipstream::aero
