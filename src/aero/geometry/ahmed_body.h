// The Ahmed body (Ahmed, Ramm & Faltin 1984, SAE 840300), parametric, as a
// closed, outward-oriented triangle mesh, and the Latin-hypercube draws of
// the shared Ahmed dataset (slant angle, length, width, height).
//
// Frame: nose at x = 0, tail at x = length, symmetric about y = 0, the
// underside at z = clearance (legs omitted). Every section x = const is a
// rectangle: over the nose, x in [0, R] (R the front radius), each of its
// four sides is set in by a(x) = R - sqrt(R^2 - (R - x)^2), so that the four
// front edges are quarter circles of radius R in side and plan view; at the
// rear the roof drops along the slant (slant_length along the surface, at
// slant_deg from the roof) to the base at x = length.
#pragma once

#include "aero/geometry/triangle_mesh.h"

#include <cstdint>
#include <string>
#include <vector>

namespace slipstream::aero {

struct AhmedBody {
  double length = 1.044, width = 0.389, height = 0.288;  // m (the standard body)
  double front_radius = 0.100, slant_length = 0.222, clearance = 0.050;
  double slant_deg = 25.0;
  // W * H: the frontal area, every coefficient's reference.
  double frontal_area() const { return width * height; }
};

// Throws naming the parameter when the body cannot be built: non-positive
// sizes, 2 R not below the width and height, a slant outside [0, 90) degrees
// or one that does not fit on the roof or into the base.
void check_ahmed_body(const AhmedBody& body);

// The mesh, its edges about `edge` long (the front's quarter circles in
// steps of at most 7.5 degrees). Closed, every edge shared by two faces in
// opposite directions, normals outward.
TriangleMesh ahmed_body_mesh(const AhmedBody& body, double edge = 0.01);

// The exact enclosed volume (the mesh's approaches it as `edge` shrinks).
double ahmed_body_volume(const AhmedBody& body);

// `cases` bodies of a Latin hypercube seeded by `seed`: slant angle uniform
// in [0, 40] degrees, length, width and height the standard body's times a
// factor in [0.9, 1.1], each column stratified into `cases` bins and
// shuffled independently; front radius, slant length and clearance fixed.
// The same (cases, seed) gives the same bodies on every machine.
std::vector<AhmedBody> ahmed_latin_hypercube(int64_t cases, uint64_t seed);

}  // namespace slipstream::aero
