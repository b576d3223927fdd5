// The `slipstream` subcommands. Each add_* registers one subcommand and its
// options with CLI11 and returns it with the function that runs it once the
// command line has been parsed; main.cpp only wires them together. A
// command returns its exit code; errors propagate as exceptions (main
// prints them and exits 1).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace slipstream::aero {
struct Run;
}  // namespace slipstream::aero

namespace slipstream::app {

struct CommandContext {
  std::string config_dir;         // holds train.yaml, model/, dataset/
  std::vector<std::string> argv;  // the command line, as given
  std::string version, commit;    // this build's (CMake's project version and git commit)
};

struct Command {
  CLI::App* subcommand = nullptr;
  std::function<int()> run;
};

Command add_train(CLI::App& app, const CommandContext& context);
Command add_bench(CLI::App& app, const CommandContext& context);
Command add_bench_data(CLI::App& app, const CommandContext& context);
Command add_info(CLI::App& app, const CommandContext& context);
Command add_make_synthetic(CLI::App& app, const CommandContext& context);
Command add_prepare(CLI::App& app, const CommandContext& context);
Command add_infer(CLI::App& app, const CommandContext& context);
// slipstream eval: infer --split without meshes (commands/infer.cpp).
Command add_eval(CLI::App& app, const CommandContext& context);
Command add_launch(CLI::App& app, const CommandContext& context);
Command add_export(CLI::App& app, const CommandContext& context);
Command add_ahmed_body(CLI::App& app, const CommandContext& context);
Command add_export_case(CLI::App& app, const CommandContext& context);

// The model= and dataset= choices in `config_dir` and how to set a key
// (train --help's footer).
std::string config_choices(const std::string& config_dir);

// Fails naming the command when this build lacks VTK.
[[noreturn]] void needs_vtk(const char* what);

// Inside a catch block of a distributed run: rethrows the error with the
// ranks that failed, died or hung first named (Communicator::
// diagnose_failure), keeping an ExitError's code.
[[noreturn]] void rethrow_with_diagnosis(aero::Run& run);

}  // namespace slipstream::app
