// Raw CFD runs as users hold them, one directory per run:
//   <run>/*.vtu          the volume mesh with the flow fields (point or cell data)
//   <run>/*.stl          the vehicle's surface (watertight)
//   <run>/metadata.json  {"U_inf": [ux, uy, uz], "rho_inf": 1.0, "p_inf": 0.0,
//                         "nu": 1.5e-5, "L_ref": 1.0}
// read_raw_run turns one into a Sample: each target field of the schema read
// from the .vtu field its name maps to (DrivAerML's names by default) and
// checked to have the schema's channel count, each point's SDF and SDF
// normal to the STL, and the free stream (U_inf, rho_inf, p_inf, L_ref) from
// metadata.json, whose other numbers (nu, a body's shape parameters) become
// globals of the same name.
//
// prepare_runs does that for every run under a directory and writes the
// trainer's format (one safetensors sample per run and manifest.json with a
// train/val split). write_synthetic_vtk_runs writes the synthetic dataset in
// the raw layout, so that the whole path runs on data made here.
#pragma once

#include "aero/data/sample.h"
#include "aero/data/sample_file.h"
#include "aero/data/synthetic.h"
#include "aero/fields/field_schema.h"
#include "aero/vtk/openfoam_case.h"
#include "aero/vtk/vtk_io.h"

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace slipstream::aero {

// Target name -> field name in DrivAerML's files (UMeanTrim, pMeanTrim,
// nutMeanTrim, wallShearStressMeanTrim).
std::map<std::string, std::string> drivaerml_field_names();

// Each target's field name in a file: `given`, else `defaults`' (e.g.
// DrivAerML's), else the target's own.
std::map<std::string, std::string> file_field_names(
    const FieldSchema& targets, const std::map<std::string, std::string>& given,
    const std::map<std::string, std::string>& defaults);

// The field names of file_field_names' map (its values, in its order).
std::vector<std::string> field_names_in_file(const std::map<std::string, std::string>& names);

// `vtu_names` maps a target to its field in the .vtu; a target it leaves out
// is looked up under DrivAerML's name, then under its own.
// `limit_points` > 0 keeps that many points (a fixed random subset) before
// the SDF is computed: a quick look at a large run.
Sample read_raw_run(const std::string& run_dir, const FieldSchema& targets,
                    const std::map<std::string, std::string>& vtu_names, int64_t limit_points = 0);

// read_raw_run's sample written straight to `out_path` (a v2 sample file)
// while the .vtu is read `block_rows` rows at a time (vtu_stream.h): memory
// set by the block and the STL, not by the volume (plus 4 bytes a point for
// the rows' permutation). Returns the points written, or -1 with the reason
// in `why_not` when the .vtu cannot be streamed (then read_raw_run reads it
// whole). The same rows, SDF and targets as read_raw_run. `progress`, if
// given, hears the fraction of the volume read so far; `times`, if given,
// gains the seconds each stage was busy.
struct StreamTimes {
  double setup = 0;   // the headers, metadata.json, the STL and its hierarchy
  double read = 0;    // the .vtu's blocks (a thread of its own)
  double sdf = 0;     // the signed distances (every core)
  double append = 0;  // the rows to their buckets (a thread of its own)
  double commit = 0;  // the buckets ordered and written (after the others)
  double wall = 0;    // the whole run
  StreamTimes& operator+=(const StreamTimes& o);
};
int64_t stream_raw_run(const std::string& run_dir, const std::string& out_path,
                       const FieldSchema& targets,
                       const std::map<std::string, std::string>& vtu_names, int64_t limit_points,
                       std::string* why_not, int64_t block_rows = 1 << 18,
                       const SampleWriteOptions& write_options = {},
                       const std::function<void(double)>& progress = {},
                       StreamTimes* times = nullptr);

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

// The pieces every reader of raw CFD shares (this file's and
// openfoam_case.h's):
// - surface_sample: a surface's cells as a sample (points, outward normals,
//   area, the targets from `file_fields`, mesh/), named `id`; normals that
//   point inward are flipped (with a warning naming `what` unless
//   `inward_expected`, as OpenFOAM's boundary faces are), and degenerate
//   cells and an open surface are reported.
// - put_targets: each target from the file's field it maps to, its
//   component count checked.
// - put_metadata: the free stream, references and parameters of a
//   metadata.json.
// - check_prepared_sample: the finished sample's shapes and finiteness.
Sample surface_sample(SurfaceData surface, const std::string& what, const std::string& id,
                      const FieldSchema& targets,
                      const std::map<std::string, std::string>& file_fields,
                      std::vector<std::string>* warnings, bool inward_expected);
void put_targets(Sample& s, const std::map<std::string, torch::Tensor>& file_data,
                 const std::map<std::string, std::string>& file_fields, const FieldSchema& targets,
                 const std::string& what);
void put_metadata(Sample& s, const std::string& meta_path);
void check_prepared_sample(const Sample& s, const FieldSchema& targets);

struct PrepareOptions {
  std::string kind = "volume";  // volume (.vtu + .stl) | surface (.vtp)
  FieldSchema targets = default_volume_fields();
  std::map<std::string, std::string> vtu_names;  // target -> .vtu/.vtp field
  double val_fraction = 0.25;
  double test_fraction = 0.0;  // the last runs (after val's) form a test split
  // A JSON dict of split name -> run directory names (e.g. the Ahmed
  // dataset's train/val): each run goes to the split that names it, runs
  // that none names are skipped with a warning, and the fractions are not
  // used. Empty: by the fractions, runs in natural order (run_2 < run_10).
  int64_t limit_points = 0;  // > 0: keep that many points (cells) per run, a quick look
  // Volumes stream from the .vtu this many rows at a time (stream_raw_run);
  // 0 reads each whole.
  int64_t stream_block_rows = 1 << 18;
  std::string splits_manifest;
  // "vtk" (DrivAerML's layout, above) or "openfoam": each run directory (or
  // --in itself) an OpenFOAM case, read with `openfoam` (openfoam_case.h).
  std::string format = "vtk";
  OpenFoamOptions openfoam;
};
struct PrepareReport {
  int64_t runs = 0, train = 0, val = 0, test = 0, points = 0;
  int64_t streamed = 0;  // runs streamed, whose stage times `stream` sums
  StreamTimes stream;
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
