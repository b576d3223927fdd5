// The built-in synthetic dataset: potential flow past a sphere, so that the
// fields are physics, not noise, and a model can learn them.
//
// Sample i (deterministic from seed and i): a sphere of radius a in
// [0.5, 1.0] centred near the origin, free stream U of speed [0.6, 1.4] whose
// direction is yawed up to +-30 degrees and pitched up to +-10 degrees from +x.
// Half the points are uniform in the box [-4, 4]^3 outside the sphere; the
// other half are graded towards the wall, as a CFD mesh is refined near the
// body: at a distance t·a from it, t exponential with mean 0.5, in a uniform
// direction. With r the offset from the centre:
//   velocity u = U (1 + a^3 / (2 r^3)) - 3 a^3 (U.r) r / (2 r^5)
//   pressure p = (|U|^2 - |u|^2) / 2          (Bernoulli, rho = 1, p_inf = 0)
//   nut      a smooth wake: grows downstream of the sphere, Gaussian across
//   sdf      |r| - a, sdf_normals r / |r|
//   volume   each point's share of the domain: 1 / (N * sampling density)
// Globals: U_inf, rho_inf 1, p_inf 0, L_ref = 2a (the sphere's diameter).
#pragma once

#include "aero/data/sample.h"

#include <array>
#include <cstdint>
#include <string>

namespace slipstream::aero {

struct SyntheticOptions {
  int64_t points_per_sample = 20000;  // volume points, or surface cells
  uint64_t seed = 1234;
  std::string kind = "volume";  // volume | surface
};

struct SyntheticSphere {
  double radius = 0;
  std::array<double, 3> center{};
};

// The tensors every synthetic sample of `kind` holds.
SampleLayout synthetic_layout(const std::string& kind = "volume");

// `body`, if given, receives the sphere of that sample. options.kind
// "surface" gives make_synthetic_surface_sample's.
Sample make_synthetic_sample(int64_t index, const SyntheticOptions& options,
                             SyntheticSphere* body = nullptr);

// The surface of sample i's sphere (same radius, centre and free stream as
// its volume sample) as a UV sphere of about points_per_sample cells (quads,
// triangles at the poles). Per cell: points (the centroid), normals
// (outward), area; pressure from potential flow, Cp = 1 - 9/4 sin^2(theta)
// with theta from the upstream stagnation point; wss a smooth skin friction
// of level Cf = 0.0592 Re^-0.2 sin(theta) (1.25 + 0.75 cos(theta)) with
// Re = |U| 2a / nu, nu = 1e-5 (a turbulent boundary layer's level): zero at
// both stagnation points, larger on the front. It is stored as OpenFOAM and
// DrivAerML store theirs, the wall's stress on the fluid, so it points
// against the surface flow (dataset.shear_stress: wall_on_fluid). Its drag is
// the friction's alone (the pressure's is zero: d'Alembert) and differs
// between samples through Re. Globals as the volume
// sample's plus A_ref = pi a^2 (the frontal area); mesh/ holds the polygons.
Sample make_synthetic_surface_sample(int64_t index, const SyntheticOptions& options);

// The analytic velocity of potential flow past a sphere (for tests).
torch::Tensor sphere_potential_flow_velocity(const torch::Tensor& offsets, double radius,
                                             const torch::Tensor& u_inf);

}  // namespace slipstream::aero
