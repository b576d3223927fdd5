// The model families a config can name (`model.name`), and how each is
// built from its config section and the widths of its inputs.
//
// A family reads its own keys under `model.` (layers, widths, heads, ...);
// its input widths come from the input spec and the dataset's samples, its
// output width from the target fields, never from constants in the config.
#pragma once

#include "aero/config/config.h"
#include "aero/model/model.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace slipstream::aero {

// Builds the family `config.model.name` (seeded by the caller); throws naming
// the key on an unknown family, a bad option, or inputs the family does not
// read.
ModelPtr build_model(const Config& config, const ModelShape& shape);

std::vector<std::string> model_family_names();

// Builds the PhysicsNeMo class `class_name` from its constructor arguments
// (a .mdlus's args.json `__args__`); `what` (the file) names errors: an
// unknown class, a missing argument, or one Slipstream does not implement
// (dropout, another activation, Transformer Engine, ...).
ModelPtr build_model_from_physicsnemo(const std::string& class_name, const nlohmann::json& args,
                                      const std::string& what);

// The constructor arguments that differ between two args.json objects, as
// "key: a vs b" (numbers compared by value: 4 equals 4.0).
std::vector<std::string> differing_args(const nlohmann::json& a, const nlohmann::json& b);

}  // namespace slipstream::aero
