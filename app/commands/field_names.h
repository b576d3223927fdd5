// The options that say where each target field is in a .vtu, shared by
// infer and prepare: --field TARGET=NAME (repeatable), and --velocity-field,
// --pressure-field, --nut-field as shorthands. A target left out is looked
// up under DrivAerML's name, then under its own (aero/vtk/raw_runs.h).
#pragma once

#include <CLI/CLI.hpp>

#include <map>
#include <string>
#include <vector>

namespace slipstream::app {

struct FieldNameOptions {
  std::vector<std::string> pairs;
  std::map<std::string, std::string> shorthands;

  void add_to(CLI::App* sub);
  // Target -> .vtu field; throws naming a pair not of the form TARGET=NAME.
  std::map<std::string, std::string> resolve() const;
};

}  // namespace slipstream::app
