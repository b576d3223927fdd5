// slipstream prepare --in RAW --out DIR [--val-fraction F] [--test-fraction F | --splits FILE]
//                    [--limit-points N] [--block-rows N] [--field T=NAME ...]
//                    [dataset=prepared_surface ...]
//                    [--format openfoam --patch NAME... [--time T] [--case-type C]]
// Raw runs to the trainer's samples: volume runs (.vtu + .stl) or, for a
// dataset of kind surface, surface runs (.vtp), in DrivAerML's layout; or,
// with --format openfoam, OpenFOAM case directories (--in one case or a
// directory of them) read through VTK's OpenFOAM reader. The target fields
// and their types come from the config's dataset (`dataset.targets`).
#include "aero/run/train_settings.h"
#include "aero/vtk/openfoam_case.h"
#include "commands/commands.h"
#include "commands/field_names.h"
#include "core/process/host_memory.h"

#include "aero/vtk/raw_runs.h"

#include <iomanip>
#include <iostream>
#include <memory>

namespace slipstream::app {

Command add_prepare(CLI::App& app, const CommandContext& context) {
  struct Options {
    std::string in, out;
    double val_fraction = 0.25, test_fraction = 0.0;
    std::string splits, format = "vtk";
    aero::OpenFoamOptions openfoam;
    int64_t limit_points = 0, block_rows = 1 << 18;
    FieldNameOptions fields;
    std::vector<std::string> overrides;
  };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand("prepare", "raw VTK/STL runs -> the trainer's samples");
  sub->add_option("--in", o->in, "directory of run directories")->required();
  sub->add_option("--out", o->out, "output directory")->required();
  auto* val_fraction =
      sub->add_option("--val-fraction", o->val_fraction, "share of runs for validation");
  auto* test_fraction =
      sub->add_option("--test-fraction", o->test_fraction, "share of runs for the test split");
  sub->add_option("--splits", o->splits,
                  "JSON dict of split -> run names (e.g. configs/splits/ahmed.json) in place of "
                  "the fractions")
      ->excludes(test_fraction)
      ->excludes(val_fraction);
  sub->add_option("--limit-points", o->limit_points,
                  "keep N points (cells) per run, a fixed random subset: a quick look (0: all)");
  sub->add_option("--block-rows", o->block_rows,
                  "volumes: stream the .vtu this many points at a time, in memory that does not "
                  "grow with the volume (0: read each whole)");
  sub->add_option("--format", o->format, "vtk (DrivAerML's layout) or openfoam (case directories)");
  sub->add_option("--patch", o->openfoam.patches,
                  "openfoam: the body's patches, names or glob patterns (repeatable)");
  sub->add_option("--time", o->openfoam.time, "openfoam: 'latest' (default) or a time");
  sub->add_option("--case-type", o->openfoam.case_type,
                  "openfoam: auto (default), reconstructed or decomposed");
  o->fields.add_to(sub);
  sub->add_option("overrides", o->overrides, "key=value config overrides (dataset.targets)");
  return {sub, [o, &context]() -> int {
            const auto config = aero::Config::load(context.config_dir, o->overrides);
            aero::PrepareOptions po;
            po.targets = aero::resolve_fields(config);
            po.kind = aero::resolve_dataset_kind(config);
            po.test_fraction = o->test_fraction;
            po.vtu_names = o->fields.resolve();
            po.val_fraction = o->val_fraction;
            po.splits_manifest = o->splits;
            po.format = o->format;
            po.openfoam = o->openfoam;
            TORCH_CHECK(po.format == "openfoam" || o->openfoam.patches.empty(),
                        "prepare: --patch is for --format openfoam");
            TORCH_CHECK(o->limit_points >= 0, "prepare: --limit-points must be >= 0");
            po.limit_points = o->limit_points;
            TORCH_CHECK(o->block_rows >= 0, "prepare: --block-rows must be >= 0");
            po.stream_block_rows = o->block_rows;
            const auto r = aero::prepare_runs(o->in, o->out, po);
            std::cout << "Prepared " << r.runs << " " << po.kind << " runs (" << r.train
                      << " train, " << r.val << " val, " << r.test << " test, " << r.points
                      << (po.kind == "surface" ? " cells" : " points") << ") into " << o->out
                      << " in " << r.seconds << " s, peak memory "
                      << format_gib(static_cast<double>(peak_rss_bytes()));
            if (!r.warnings.empty()) std::cout << ", " << r.warnings.size() << " warnings";
            std::cout << "\n";
            if (r.streamed > 0) {
              // Where a streamed volume's time went: read, SDF and append
              // overlap, so their sum exceeds the wall time.
              const auto& t = r.stream;
              std::cout << std::fixed << std::setprecision(2) << "Streamed " << r.streamed
                        << (r.streamed == 1 ? " volume" : " volumes") << " in " << t.wall
                        << " s: setup " << t.setup << " s, then read " << t.read
                        << " s, signed distance " << t.sdf << " s and append " << t.append
                        << " s overlapped, then commit " << t.commit << " s\n";
            }
            return 0;
          }};
}

}  // namespace slipstream::app
