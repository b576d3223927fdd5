// slipstream: the command-line front end. It only wires the subcommands of
// app/commands/ into CLI11 and turns an error into a message and exit 1.
#include "aero/config/config.h"
#include "commands/commands.h"
#include "core/process/exit_error.h"

#include <c10/util/Exception.h>
#include <torch/version.h>
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  using namespace slipstream;
  CLI::App app{
      "Slipstream: surrogate-model training for external aerodynamics, with per-step "
      "logging that never makes the host wait for the GPU"};
  app.require_subcommand(1);
  app::CommandContext context{
      aero::default_config_dir(), {argv, argv + argc}, SLIPSTREAM_VERSION, SLIPSTREAM_COMMIT};
  app.add_option("--config-dir", context.config_dir,
                 "directory holding train.yaml, model/, "
                 "dataset/");
  std::vector<app::Command> commands;
  for (auto add : {app::add_train, app::add_bench, app::add_bench_data, app::add_info,
                   app::add_make_synthetic, app::add_prepare, app::add_infer, app::add_eval,
                   app::add_launch, app::add_export, app::add_export_case, app::add_ahmed_body}) {
    commands.push_back(add(app, context));
  }
  app.set_version_flag("--version", std::string("slipstream ") + SLIPSTREAM_VERSION +
                                        " (configured at commit " + SLIPSTREAM_COMMIT +
                                        "), LibTorch " + TORCH_VERSION);
  // A first word that is no command: name the closest one.
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--config-dir") {
      ++i;
      continue;
    }
    if (word.rfind('-', 0) == 0) break;
    std::string names, closest;
    size_t best = std::string::npos;
    for (const auto& command : commands) {
      const std::string& name = command.subcommand->get_name();
      names += (names.empty() ? "" : ", ") + name;
      const size_t d = aero::edit_distance(word, name);
      if (d < best) {
        best = d;
        closest = name;
      }
      if (name == word) best = 0;
    }
    if (best == 0) break;
    std::cerr << "slipstream: error: '" << word << "' is not a command"
              << (best <= 3 ? "; did you mean '" + closest + "'?" : "") << " (commands: " << names
              << "; slipstream --help)\n";
    return 1;
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
    // PyTorch's switch for C++ stack traces: with it, the error says where.
    const char* trace = std::getenv("TORCH_SHOW_CPP_STACKTRACES");
    const bool with_trace = trace != nullptr && std::string(trace) == "1";
    std::cerr << "slipstream: error: " << (with_trace ? e.what() : e.what_without_backtrace())
              << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "slipstream: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
