// PhysicsNeMo's .mdlus checkpoints (Module.save / Module.from_checkpoint):
// an archive — zip with stored entries, or tar from older versions — of
//   model.pt       the state dict, in torch.save's format (core/io/torch_save.h)
//   args.json      {"__name__": class, "__module__": its module,
//                   "__args__": the constructor arguments}
//   metadata.json  {"mdlus_file_version": "0.1.0", ...}
// Our models carry PhysicsNeMo's state-dict names and declare their
// constructor arguments (Model::physicsnemo_args), so both directions are
// exact. Every error names the file.
#pragma once

#include "aero/model/model.h"
#include "core/io/torch_save.h"

#include <nlohmann/json.hpp>

#include <string>

namespace slipstream::aero {

struct MdlusFile {
  std::string path;
  std::string class_name, module;  // args.json __name__, __module__
  nlohmann::json args;             // args.json __args__
  nlohmann::json metadata;         // metadata.json
  NamedTensors state;              // model.pt, in its order
};

// Whether `path` names a .mdlus file (by its extension).
bool is_mdlus_path(const std::string& path);

MdlusFile read_mdlus(const std::string& path);

// The model the file's class and arguments describe, with its weights.
ModelPtr build_from_mdlus(const MdlusFile& file);

// Copies the file's weights into `model`, which must be the same class with
// the same constructor arguments (else an error listing every difference,
// "key: model vs file") and hold exactly the file's parameters.
void load_mdlus_weights(Model& model, const MdlusFile& file);

// Writes `model` as a .mdlus PhysicsNeMo's Module.from_checkpoint reads:
// a stored zip of model.pt (fp32 CPU tensors, the model's own names),
// args.json and metadata.json; atomically.
void write_mdlus(const std::string& path, Model& model);

}  // namespace slipstream::aero
