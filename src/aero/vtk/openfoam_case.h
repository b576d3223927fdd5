// OpenFOAM case directories as OpenFOAM users have them, read through VTK's
// own reader (vtkPOpenFOAMReader, reconstructed or decomposed into
// processor*/), not a parser of ours:
//   CASE/system/controlDict, constant/polyMesh (or processor*/...), time
//   directories with the fields, and optionally postProcessing/forceCoeffs*
//   (the CFD's own coefficients and the references they used) and
//   metadata.json (U_inf, rho_inf, p_inf, L_ref, A_ref, parameters).
// A surface sample is the body's patches (one row per boundary face: the
// centroid, the outward normal, the area, the fields' face values); a
// volume sample is every fluid cell (its centre, the average of its
// vertices, and the cell values) with the SDF to the body's patches, which
// must close.
#pragma once

#include "aero/data/sample.h"
#include "aero/fields/field_schema.h"

#include <map>
#include <string>
#include <vector>

namespace slipstream::aero {

struct OpenFoamOptions {
  std::string time = "latest";       // "latest" or a time as written (e.g. 500, 0.25)
  std::vector<std::string> patches;  // the body: patch names or glob patterns (required)
  std::string case_type = "auto";    // auto (decomposed when only processor*/ holds the time) |
                                     // reconstructed | decomposed
};

// True when `dir` is an OpenFOAM case (it has system/controlDict).
bool is_openfoam_case(const std::string& dir);

// Target name -> the case's field name by default: velocity U, pressure p,
// nut nut, wss wallShearStress (`names` overrides any of them).
std::map<std::string, std::string> openfoam_field_names();

// `kind` is "surface" or "volume". Every problem is an error naming the
// case and listing what it has: its patches, its fields, its times.
// The free stream and references come from the case's forceCoeffs function
// object (U_inf = magUInf along dragDir, L_ref = lRef, A_ref = Aref,
// rho_inf 1 and p_inf 0: incompressible solvers' kinematic values) and its
// metadata.json where it has one (which wins); its coefficients at the
// chosen time become the globals CD_cfd, CL_cfd, CS_cfd, unless
// metadata.json gives them (coefficients averaged as the fields were:
// scripts/ahmed_dataset.sh).
Sample read_openfoam_case(const std::string& case_dir, const std::string& kind,
                          const FieldSchema& targets,
                          const std::map<std::string, std::string>& names,
                          const OpenFoamOptions& options,
                          std::vector<std::string>* warnings = nullptr);

// A case written as one run of DrivAerML's raw layout (the shared Ahmed
// dataset's), into `run_dir` (created; refused if it exists and is not
// empty; written beside it and renamed, so never half there):
//   boundary_<index>.vtp  the body's faces as OpenFOAM has them (normals into
//                         the body), cell data pMeanTrim, wallShearStressMeanTrim
//                         and CpMeanTrim = (p - p_inf) / q_inf
//   volume_<index>.vtu    `volume_cells` fluid cells drawn with `seed` (all
//                         when the case has fewer), vertices at their centres
//                         with point data UMeanTrim, pMeanTrim, nutMeanTrim
//   drivaer_<index>.stl   the body's faces as triangles, outward
//   force_mom_<index>.csv Cd, Cl, Cs: the CFD's own (metadata.json's, else
//                         the forceCoeffs row at that time), when known
//   metadata.json         the case's, else U_inf and the references
// `names` maps the targets velocity, pressure, nut, wss to the case's
// fields (defaults: openfoam_field_names()).
struct RawRunExport {
  std::string index = "1";       // the files' suffix
  int64_t volume_cells = 60000;  // fluid cells kept
  uint64_t seed = 0;
};
void export_openfoam_case(const std::string& case_dir, const std::string& run_dir,
                          const std::map<std::string, std::string>& names,
                          const OpenFoamOptions& options, const RawRunExport& run);

}  // namespace slipstream::aero
