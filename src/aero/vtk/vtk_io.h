// VTK files read and written through VTK 9: volume meshes (.vtu) with their
// point data, and surfaces (.vtp) with their cell data. Every failure names
// the file and the field. (A .vtu is written without VTK: vtu_writer.h;
// STL files: geometry/stl_file.h.)
#pragma once

#include "aero/geometry/surface_mesh.h"
#include "aero/geometry/triangle_mesh.h"

#include <torch/types.h>

#include <map>
#include <string>
#include <vector>

class vtkDataArray;
class vtkPolyData;

namespace slipstream::aero {

// A VTK array as an (n, components) float32 tensor; `where` names it in the
// error for an empty one.
torch::Tensor tensor_of(vtkDataArray* array, const std::string& where);

struct VolumeMesh {
  torch::Tensor points;                         // (N,3) float32
  std::map<std::string, torch::Tensor> fields;  // name -> (N,C) float32
};

// Reads the named fields of a .vtu as point data; a field stored as cell
// data is moved to the points (averaged over the cells around each point).
VolumeMesh read_vtu(const std::string& path, const std::vector<std::string>& field_names);
// The same for a .vtu shipped in pieces (volume_i.vtu.00.part, .01.part,
// ...), read in order as one stream: no concatenated copy is written.
VolumeMesh read_vtu(const std::vector<std::string>& pieces,
                    const std::vector<std::string>& field_names);

// Surfaces (.vtp, DrivAerML's boundary_i.vtp): the polygons and the named
// fields per cell; a field stored as point data is moved to the cells
// (averaged over each cell's vertices). Triangle strips are not read.
struct SurfaceData {
  SurfaceMesh mesh;
  std::map<std::string, torch::Tensor> cell_fields;  // name -> (C, K) float32
};
SurfaceData read_vtp(const std::string& path, const std::vector<std::string>& field_names);
// The same of a surface in memory; `what` names it in messages.
SurfaceData surface_of(vtkPolyData* poly, const std::string& what,
                       const std::vector<std::string>& field_names);

// Writes the polygons with per-cell fields (C rows each), atomically.
void write_vtp(const std::string& path, const SurfaceMesh& mesh,
               const std::vector<std::pair<std::string, torch::Tensor>>& cell_fields);

}  // namespace slipstream::aero
