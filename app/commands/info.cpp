// slipstream info [key=value ...]: the resolved config, the model it builds,
// its inputs' widths and its parameter count.
#include "aero/train/run.h"
#include "commands/commands.h"

#include <torch/torch.h>

#include <iostream>
#include <memory>

namespace slipstream::app {

Command add_info(CLI::App& app, const CommandContext& context) {
  auto overrides = std::make_shared<std::vector<std::string>>();
  auto* sub = app.add_subcommand("info", "print the resolved config and parameter count");
  sub->add_option("overrides", *overrides, "key=value config overrides");
  return {sub, [overrides, &context] {
            const auto config = aero::Config::load(context.config_dir, *overrides);
            const auto spec = aero::resolve_run_spec(config);
            const auto data = aero::open_datasets(spec);
            const auto shape = aero::model_shape(spec, data.train->layout());
            torch::manual_seed(spec.settings.seed);
            const auto model = aero::build_model(config, shape);
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
