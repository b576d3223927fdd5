// slipstream make-synthetic --out DIR [--format samples|vtk] [key=value ...]
#include "aero/data/dataset.h"
#include "aero/train/run.h"
#include "commands/commands.h"

#include "aero/vtk/raw_runs.h"

#include <c10/util/Exception.h>

#include <iostream>
#include <memory>

namespace slipstream::app {

void needs_vtk(const char* what) {
  TORCH_CHECK(false, what,
              " needs VTK; this slipstream was built without it (install libvtk9-dev and "
              "rebuild)");
}

Command add_make_synthetic(CLI::App& app, const CommandContext& context) {
  struct Options {
    std::string out, format = "samples";
    std::vector<std::string> overrides;
  };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand("make-synthetic", "write the synthetic dataset to disk");
  sub->add_option("--out", o->out, "output directory")->required();
  sub->add_option("--format", o->format, "samples (the trainer's format) or vtk (raw runs)");
  sub->add_option("overrides", o->overrides, "key=value config overrides");
  return {sub, [o, &context] {
            const auto config = aero::Config::load(context.config_dir, o->overrides);
            const auto s = aero::resolve_settings(config);
            TORCH_CHECK(o->format == "samples" || o->format == "vtk", "make-synthetic: --format '",
                        o->format, "' is not one of samples, vtk");
            if (o->format == "vtk") {
              aero::write_synthetic_vtk_runs(o->out, s.synthetic, s.num_train + s.num_val);
              const bool surface = s.synthetic.kind == "surface";
              std::cout << "Wrote " << s.num_train + s.num_val
                        << (surface
                                ? " surface runs (.vtp + metadata.json + geo_ref + force_mom) of "
                                : " runs (.vtu + .stl + metadata.json) of ")
                        << s.synthetic.points_per_sample << (surface ? " cells" : " points")
                        << " to " << o->out << "\n";
              return 0;
            }
            aero::write_synthetic_directory(o->out, s.synthetic, s.num_train, s.num_val);
            std::cout << "Wrote " << s.num_train << " train and " << s.num_val << " val samples of "
                      << s.synthetic.points_per_sample << " points to " << o->out << "\n";
            return 0;
          }};
}

}  // namespace slipstream::app
