// slipstream: the command-line front end. It only wires the subcommands of
// app/commands/ into CLI11 and turns an error into a message and exit 1.
#include "aero/config/config.h"
#include "commands/commands.h"
#include "core/process/exit_error.h"

#include <c10/util/Exception.h>
#include <CLI/CLI.hpp>

#include <iostream>

int main(int argc, char** argv) {
  using namespace slipstream;
  CLI::App app{
      "Slipstream: surrogate-model training for external aerodynamics, with per-step "
      "logging that never makes the host wait for the GPU"};
  app.require_subcommand(1);
  app::CommandContext context{aero::default_config_dir()};
  app.add_option("--config-dir", context.config_dir,
                 "directory holding train.yaml, model/, "
                 "dataset/");
  std::vector<app::Command> commands;
  for (auto add :
       {app::add_train, app::add_bench, app::add_bench_data, app::add_info, app::add_make_synthetic,
        app::add_prepare, app::add_infer, app::add_launch, app::add_export}) {
    commands.push_back(add(app, context));
  }
  CLI11_PARSE(app, argc, argv);
  try {
    for (const auto& command : commands) {
      if (command.subcommand->parsed()) return command.run();
    }
  } catch (const ExitError& e) {  // its own exit code (a non-finite loss: 3)
    std::cerr << "slipstream: error: " << e.what() << "\n";
    return e.code();
  } catch (const c10::Error& e) {
    std::cerr << "slipstream: error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "slipstream: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
