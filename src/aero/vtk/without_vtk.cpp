// A build without VTK (the GPU image): what only VTK reads or writes refuses,
// naming the file and what it would take. The streamed volume path
// (raw_runs.h's stream_raw_run, vtu_stream.h, vtu_writer.h, stl_file.h)
// works without it. Empty in a build with VTK.
#include "aero/vtk/openfoam_case.h"
#include "aero/vtk/raw_runs.h"
#include "aero/vtk/vtk_io.h"

#include <stdexcept>

#ifndef SLIPSTREAM_WITH_VTK

namespace slipstream::aero {

namespace {
[[noreturn]] void without_vtk(const std::string& what, const std::string& file) {
  throw std::runtime_error(what + " '" + file +
                           "' needs VTK; this slipstream was built without it (install "
                           "libvtk9-dev and rebuild)");
}
}  // namespace

VolumeMesh read_vtu(const std::string& path, const std::vector<std::string>&) {
  without_vtk("reading the whole of", path);
}

VolumeMesh read_vtu(const std::vector<std::string>& pieces, const std::vector<std::string>&) {
  without_vtk("reading the whole of (it cannot be streamed)", pieces.empty() ? "" : pieces.front());
}

SurfaceData read_vtp(const std::string& path, const std::vector<std::string>&) {
  without_vtk("reading the surface", path);
}

void write_vtp(const std::string& path, const SurfaceMesh&,
               const std::vector<std::pair<std::string, torch::Tensor>>&) {
  without_vtk("writing the surface", path);
}

bool is_openfoam_case(const std::string& dir) { without_vtk("the OpenFOAM case", dir); }

Sample read_openfoam_case(const std::string& case_dir, const std::string&, const FieldSchema&,
                          const std::map<std::string, std::string>&, const OpenFoamOptions&,
                          std::vector<std::string>*) {
  without_vtk("the OpenFOAM case", case_dir);
}

}  // namespace slipstream::aero

#endif  // SLIPSTREAM_WITH_VTK
