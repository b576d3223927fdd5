// slipstream ahmed-body --out body.stl [--case I --cases N --seed S]: one
// parametric Ahmed body (aero/geometry/ahmed_body.h) as a binary STL, either
// case I of the Latin hypercube of N cases drawn with seed S (the dataset
// generator, scripts/ahmed_dataset.sh) or the standard body with the
// parameters given. Prints the body's parameters as name=value lines, which
// a shell script can `eval`.
#include "aero/geometry/ahmed_body.h"
#include "aero/geometry/stl_file.h"
#include "commands/commands.h"
#include "commands/output_guard.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>

namespace slipstream::app {

Command add_ahmed_body(CLI::App& app, const CommandContext& /*context*/) {
  struct Options {
    std::string out;
    int64_t index = -1, cases = 0;
    uint64_t seed = 0;
    double edge = 0.01;
    aero::AhmedBody body;
  };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand(
      "ahmed-body", "write a parametric Ahmed body as an STL and print its parameters");
  sub->add_option("--out", o->out, "the .stl to write")->required();
  sub->add_option("--case", o->index, "case I (0-based) of the Latin hypercube of --cases");
  sub->add_option("--cases", o->cases, "cases in the Latin hypercube");
  sub->add_option("--seed", o->seed, "the Latin hypercube's seed")->capture_default_str();
  sub->add_option("--slant", o->body.slant_deg, "slant angle, degrees (without --case)")
      ->capture_default_str();
  sub->add_option("--length", o->body.length, "m (without --case)")->capture_default_str();
  sub->add_option("--width", o->body.width, "m (without --case)")->capture_default_str();
  sub->add_option("--height", o->body.height, "m (without --case)")->capture_default_str();
  sub->add_option("--edge", o->edge, "the mesh's edge length, m")->capture_default_str();
  return {sub, [o]() -> int {
            TORCH_CHECK((o->index >= 0) == (o->cases > 0),
                        "ahmed-body: --case and --cases go together");
            aero::AhmedBody b = o->body;
            if (o->cases > 0) {
              TORCH_CHECK(o->index < o->cases, "ahmed-body: --case ", o->index,
                          " is not below --cases ", o->cases);
              b = aero::ahmed_latin_hypercube(o->cases, o->seed)[static_cast<size_t>(o->index)];
            }
            // An STL may be replaced; anything else at --out is left alone.
            check_output_file(o->out, {}, [](const std::string& path) {
              return path.size() > 4 && path.substr(path.size() - 4) == ".stl";
            });
            const auto mesh = aero::ahmed_body_mesh(b, o->edge);
            aero::write_stl(o->out, mesh);
            const aero::AhmedBody standard;
            std::printf(
                "phi=%.4f\nlength=%.6f\nwidth=%.6f\nheight=%.6f\nfront_radius=%.6f\n"
                "slant_length=%.6f\nclearance=%.6f\naRef=%.8f\naRefRef=%.6f\ntriangles=%zu\n",
                b.slant_deg, b.length, b.width, b.height, b.front_radius, b.slant_length,
                b.clearance, b.frontal_area(), standard.frontal_area(), mesh.faces.size());
            return 0;
          }};
}

}  // namespace slipstream::app
