// Raw CFD runs as users hold them, one directory per run:
//   <run>/*.vtu          the volume mesh with the flow fields (point or cell data)
//   <run>/*.stl          the vehicle's surface (watertight)
//   <run>/metadata.json  {"U_inf": [ux, uy, uz], "rho_inf": 1.0, "p_inf": 0.0,
//                         "nu": 1.5e-5, "L_ref": 1.0}
// read_raw_run turns one into a Sample: each target field of the schema read
// from the .vtu field its name maps to (DrivAerML's names by default) and
// checked to have the schema's channel count, each point's SDF and SDF
// normal to the STL, and the free stream (U_inf, rho_inf, p_inf, L_ref) from
// metadata.json.
//
// prepare_runs does that for every run under a directory and writes the
// trainer's format (one safetensors sample per run and manifest.json with a
// train/val split). write_synthetic_vtk_runs writes the synthetic dataset in
// the raw layout, so that the whole path runs on data made here.
#pragma once

#include "aero/data/sample.h"
#include "aero/data/synthetic.h"
#include "aero/fields/field_schema.h"

#include <map>
#include <string>
#include <vector>

namespace slipstream::aero {

// Target name -> field name in DrivAerML's files (UMeanTrim, pMeanTrim,
// nutMeanTrim, wallShearStressMeanTrim).
std::map<std::string, std::string> drivaerml_field_names();

// `vtu_names` maps a target to its field in the .vtu; a target it leaves out
// is looked up under DrivAerML's name, then under its own.
// `limit_points` > 0 keeps that many points (a fixed random subset) before
// the SDF is computed: a quick look at a large run.
Sample read_raw_run(const std::string& run_dir, const FieldSchema& targets,
                    const std::map<std::string, std::string>& vtu_names, int64_t limit_points = 0);

// A surface run (DrivAerML's layout):
//   <run>/*.vtp              the surface with cell data (pMeanTrim,
//                            wallShearStressMeanTrim), polygons
//   <run>/metadata.json      optional: U_inf, rho_inf, p_inf, L_ref, A_ref;
//                            without it DrivAerML's free stream (U_inf
//                            [38.89, 0, 0], rho_inf 1: its pressures are
//                            kinematic) with a warning
//   <run>/geo_ref*.csv       optional: lRef, aRef (L_ref, A_ref)
//   <run>/force_mom*.csv     optional: the CFD's own Cd, Cl, Cs, kept as the
//                            globals CD_cfd, CL_cfd, CS_cfd
// Per cell: points (centroid), normals (outward), area, the targets; mesh/
// keeps the polygons. Inward normals are flipped and degenerate cells and
// a surface that is not closed are reported, each warning naming the file.
Sample read_raw_surface_run(const std::string& run_dir, const FieldSchema& targets,
                            const std::map<std::string, std::string>& vtp_names,
                            std::vector<std::string>* warnings = nullptr, int64_t limit_points = 0);

struct PrepareOptions {
  std::string kind = "volume";  // volume (.vtu + .stl) | surface (.vtp)
  FieldSchema targets = default_volume_fields();
  std::map<std::string, std::string> vtu_names;  // target -> .vtu/.vtp field
  double val_fraction = 0.25;
  double test_fraction = 0.0;  // the last runs (after val's) form a test split
  int64_t limit_points = 0;    // > 0: keep that many points (cells) per run, a quick look
};
struct PrepareReport {
  int64_t runs = 0, train = 0, val = 0, test = 0, points = 0;
  std::vector<std::string> warnings;
  double seconds = 0;
};
PrepareReport prepare_runs(const std::string& in_dir, const std::string& out_dir,
                           const PrepareOptions& options);

// Volume runs (.vtu + .stl + metadata.json) or, for options.kind surface,
// surface runs (boundary_i.vtp + metadata.json + geo_ref_i.csv +
// force_mom_i.csv with the coefficients integrated from the exact fields).
void write_synthetic_vtk_runs(const std::string& out_dir, const SyntheticOptions& options,
                              int64_t count);

}  // namespace slipstream::aero
