// slipstream info [key=value ...]: the resolved config, the model it builds,
// its inputs' widths and its parameter count.
// slipstream info --checkpoint FILE: the model a checkpoint holds — a
// PhysicsNeMo .mdlus or ours (a file, checkpoints/ or a run directory) —
// its class, PhysicsNeMo constructor arguments and parameter count; for
// ours also where its run stood (epochs, step, val loss), its run and
// precision, and its targets with their scaling.
#include "aero/infer/trained_model.h"
#include "aero/interop/mdlus.h"
#include "aero/train/run.h"
#include "commands/commands.h"

#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <memory>

namespace slipstream::app {
namespace {

int info_of_checkpoint(const std::string& path) {
  aero::ModelPtr model;
  if (aero::is_mdlus_path(path)) {
    const auto file = aero::read_mdlus(path);
    model = aero::build_from_mdlus(file);
    const std::string format = "PhysicsNeMo .mdlus (mdlus_file_version " +
                               file.metadata.value("mdlus_file_version", std::string("?")) + ")";
    std::cout << "checkpoint: " << path << " (" << format << ")\n";
  } else {
    const auto trained = aero::load_trained(path, c10::Device(c10::kCPU));
    model = trained.model;
    const auto& c = trained.checkpoint;
    const auto& p = c.position;
    std::cout << "checkpoint: " << c.path << " (Slipstream checkpoint)\n"
              << "position: " << p.epochs_done << " of " << trained.spec.settings.num_epochs
              << " epochs done"
              << (p.steps_into_epoch > 0
                      ? " and " + std::to_string(p.steps_into_epoch) + " steps of the next"
                      : std::string())
              << ", step " << p.global_step;
    const auto loss = c.metadata.find("val_loss");
    if (loss != c.metadata.end()) {
      char text[32];
      std::snprintf(text, sizeof text, "%.6g", std::stod(loss->second));
      std::cout << ", val loss " << text << " (normalised)";
    }
    std::cout << "\nrun: " << trained.spec.settings.run_id << ", trained in "
              << aero::to_string(trained.trained_precision) << "\n"
              << "targets and their scaling: " << trained.fields.to_json().dump() << "\n";
  }
  std::cout << "model: " << model->class_name() << " (" << model->physicsnemo_module() << ")\n"
            << "args: " << model->physicsnemo_args().dump() << "\n"
            << "parameters: " << model->parameter_count() << "\n";
  return 0;
}

}  // namespace

Command add_info(CLI::App& app, const CommandContext& context) {
  auto overrides = std::make_shared<std::vector<std::string>>();
  auto checkpoint = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("info", "print the resolved config and parameter count");
  sub->add_option("overrides", *overrides, "key=value config overrides");
  sub->add_option("--checkpoint", *checkpoint,
                  "describe this checkpoint instead (.mdlus, checkpoint file or run directory)");
  return {sub, [overrides, checkpoint, &context] {
            if (!checkpoint->empty()) return info_of_checkpoint(*checkpoint);
            const auto config = aero::Config::load(context.config_dir, *overrides);
            const auto spec = aero::resolve_run_spec(config);
            const auto data = aero::open_datasets(spec);
            const auto shape = aero::model_shape(spec, data.train->layout());
            const auto model = aero::build_initial_model(config, shape, spec.settings.seed);
            config.check_known_keys();
            std::cout << config.to_yaml();
            std::cout << "model: " << model->class_name() << " (" << spec.model_config
                      << "), inputs:";
            for (const auto& [name, width] : shape.input_widths) {
              std::cout << " " << name << " " << width;
            }
            std::cout << ", outputs " << shape.out_dim << " (";
            const auto names = spec.fields.names();
            for (size_t i = 0; i < names.size(); ++i) std::cout << (i ? ", " : "") << names[i];
            std::cout << ")\nparameters: " << model->parameter_count() << "\n";
            return 0;
          }};
}

}  // namespace slipstream::app
