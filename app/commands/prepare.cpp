// slipstream prepare --in RAW --out DIR [--val-fraction F] [--test-fraction F]
//                    [--limit-points N] [--field T=NAME ...] [dataset=prepared_surface ...]
// Raw runs to the trainer's samples: volume runs (.vtu + .stl) or, for a
// dataset of kind surface, surface runs (.vtp). The target fields and their
// types come from the config's dataset (`dataset.targets`).
#include "aero/train/train_settings.h"
#include "commands/commands.h"
#include "commands/field_names.h"

#ifdef SLIPSTREAM_WITH_VTK
#include "aero/vtk/raw_runs.h"
#endif

#include <iostream>
#include <memory>

namespace slipstream::app {

Command add_prepare(CLI::App& app, const CommandContext& context) {
  struct Options {
    std::string in, out;
    double val_fraction = 0.25, test_fraction = 0.0;
    int64_t limit_points = 0;
    FieldNameOptions fields;
    std::vector<std::string> overrides;
  };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand("prepare", "raw VTK/STL runs -> the trainer's samples");
  sub->add_option("--in", o->in, "directory of run directories")->required();
  sub->add_option("--out", o->out, "output directory")->required();
  sub->add_option("--val-fraction", o->val_fraction, "share of runs for validation");
  sub->add_option("--test-fraction", o->test_fraction, "share of runs for the test split");
  sub->add_option("--limit-points", o->limit_points,
                  "keep N points (cells) per run, a fixed random subset: a quick look (0: all)");
  o->fields.add_to(sub);
  sub->add_option("overrides", o->overrides, "key=value config overrides (dataset.targets)");
  return {sub, [o, &context]() -> int {
#ifdef SLIPSTREAM_WITH_VTK
            const auto config = aero::Config::load(context.config_dir, o->overrides);
            aero::PrepareOptions po;
            po.targets = aero::resolve_fields(config);
            po.kind = aero::resolve_dataset_kind(config);
            po.test_fraction = o->test_fraction;
            po.vtu_names = o->fields.resolve();
            po.val_fraction = o->val_fraction;
            TORCH_CHECK(o->limit_points >= 0, "prepare: --limit-points must be >= 0");
            po.limit_points = o->limit_points;
            const auto r = aero::prepare_runs(o->in, o->out, po);
            std::cout << "Prepared " << r.runs << " " << po.kind << " runs (" << r.train
                      << " train, " << r.val << " val, " << r.test << " test, " << r.points
                      << (po.kind == "surface" ? " cells" : " points") << ") into " << o->out
                      << " in " << r.seconds << " s";
            if (!r.warnings.empty()) std::cout << ", " << r.warnings.size() << " warnings";
            std::cout << "\n";
            return 0;
#else
            needs_vtk("prepare");
#endif
          }};
}

}  // namespace slipstream::app
