// STL files (a vehicle's surface), binary and ASCII, without VTK.
//
// read_stl takes binary STL (an 80-byte header, a uint32 triangle count,
// 50 bytes a triangle: normal, three corners as float32, a uint16) when the
// file is exactly as long as its count says, else ASCII ("solid", then
// "facet ... outer loop / vertex x y z (three times) / endloop / endfacet").
// As vtkSTLReader does with merging on: corners with the same float32
// coordinates become one vertex, numbered in the order they first appear,
// and a triangle two of whose corners are the same vertex is dropped. Every
// failure names the file.
//
// write_stl writes binary STL (float32 corners, each facet's unit normal
// from its corners) through a temp file and a rename: the file appears
// whole or not at all.
#pragma once

#include "aero/geometry/triangle_mesh.h"

#include <string>

namespace slipstream::aero {

TriangleMesh read_stl(const std::string& path);
void write_stl(const std::string& path, const TriangleMesh& mesh);

}  // namespace slipstream::aero
