// slipstream export-case --case CASE --out RUN_DIR --patch body [--index I]:
// one OpenFOAM case as a run of DrivAerML's raw layout
// (aero/vtk/openfoam_case.h, export_openfoam_case), which `prepare` (vtk
// format) then reads like the shared Ahmed dataset.
#include "commands/commands.h"
#include "commands/field_names.h"

#ifdef SLIPSTREAM_WITH_VTK
#include "aero/vtk/openfoam_case.h"
#endif

#include <c10/util/Exception.h>

#include <filesystem>
#include <iostream>
#include <memory>

namespace slipstream::app {

Command add_export_case(CLI::App& app, const CommandContext& /*context*/) {
  struct Options {
    std::string case_dir, out, index = "1", time = "latest", case_type = "auto";
    std::vector<std::string> patches;
    int64_t volume_cells = 60000;
    uint64_t seed = 0;
    FieldNameOptions fields;
  };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand(
      "export-case",
      "write an OpenFOAM case as a run of DrivAerML's raw layout (.vtp, .vtu, .stl)");
  sub->add_option("--case", o->case_dir, "the OpenFOAM case directory")->required();
  sub->add_option("--out", o->out, "the run directory to write (new or empty)")->required();
  sub->add_option("--patch", o->patches, "the body's patches, names or glob patterns")->required();
  sub->add_option("--index", o->index, "the files' suffix: boundary_<index>.vtp, ...")
      ->capture_default_str();
  sub->add_option("--time", o->time, "'latest' or a time")->capture_default_str();
  sub->add_option("--case-type", o->case_type, "auto, reconstructed or decomposed")
      ->capture_default_str();
  sub->add_option("--volume-cells", o->volume_cells, "fluid cells drawn into volume_<index>.vtu")
      ->capture_default_str();
  sub->add_option("--seed", o->seed, "the draw's seed")->capture_default_str();
  o->fields.add_to(sub);
  return {sub, [o]() -> int {
#ifndef SLIPSTREAM_WITH_VTK
            needs_vtk("export-case");
#else
            namespace fs = std::filesystem;
            const auto in = fs::weakly_canonical(o->case_dir);
            const auto out = fs::weakly_canonical(o->out);
            const auto rel = out.lexically_relative(in);
            TORCH_CHECK(rel.empty() || *rel.begin() == "..", "export-case: --out '", o->out,
                        "' is inside the case '", o->case_dir, "'");
            aero::OpenFoamOptions of;
            of.time = o->time;
            of.patches = o->patches;
            of.case_type = o->case_type;
            aero::RawRunExport run;
            run.index = o->index;
            run.volume_cells = o->volume_cells;
            run.seed = o->seed;
            aero::export_openfoam_case(o->case_dir, o->out, o->fields.resolve(), of, run);
            std::cout << "Wrote " << o->out << " (boundary_" << o->index << ".vtp, volume_"
                      << o->index << ".vtu, drivaer_" << o->index << ".stl) from "
                      << o->case_dir << "\n";
            return 0;
#endif
          }};
}

}  // namespace slipstream::app
