// slipstream export --checkpoint CKPT --out model.mdlus: a trained model as
// PhysicsNeMo's .mdlus (aero/interop/mdlus.h), for Module.from_checkpoint.
#include "aero/infer/trained_model.h"
#include "aero/interop/mdlus.h"
#include "aero/train/run.h"
#include "commands/commands.h"
#include "commands/output_guard.h"

#include <fstream>

#include <iostream>
#include <memory>

namespace slipstream::app {

Command add_export(CLI::App& app, const CommandContext& /*context*/) {
  struct Options {
    std::string checkpoint, out;
  };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand("export", "write a trained model as a PhysicsNeMo .mdlus");
  sub->add_option("--checkpoint", o->checkpoint, "checkpoint file, checkpoints/ or run directory")
      ->required();
  sub->add_option("--out", o->out, "the .mdlus to write")->required();
  return {sub, [o] {
            // A .mdlus is a zip: an existing one may be replaced, nothing else.
            check_output_file(o->out, {o->checkpoint}, [](const std::string& path) {
              std::ifstream in(path, std::ios::binary);
              char magic[4] = {};
              return in.read(magic, 4) && std::string(magic, 4) == std::string("PK\3\4", 4);
            });
            const auto trained = aero::load_trained(o->checkpoint, c10::Device(c10::kCPU));
            aero::write_mdlus(o->out, *trained.model);
            std::cout << "Wrote " << o->out << ": " << trained.model->class_name() << ", "
                      << trained.model->parameter_count() << " parameters, from "
                      << trained.checkpoint.path << "\n";
            return 0;
          }};
}

}  // namespace slipstream::app
