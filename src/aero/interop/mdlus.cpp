#include "aero/interop/mdlus.h"

#include "aero/model/registry.h"
#include "core/io/archive.h"
#include "core/io/atomic_file.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

namespace slipstream::aero {
namespace {

std::string read_bytes(const std::string& path) {
  TORCH_CHECK(std::filesystem::is_regular_file(path), "'", path, "' does not exist");
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "'", path, "' cannot be read");
  return {std::istreambuf_iterator<char>(in), {}};
}

nlohmann::json parse_json(const std::string& text, const std::string& what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "'", what, "': not valid JSON: ", e.what());
  }
}

}  // namespace

bool is_mdlus_path(const std::string& path) {
  return std::filesystem::path(path).extension() == ".mdlus";
}

MdlusFile read_mdlus(const std::string& path) {
  const auto entries = read_archive(read_bytes(path), path);
  for (const char* name : {"model.pt", "args.json"}) {
    TORCH_CHECK(entries.count(name), "'", path, "': no '", name,
                "' in the archive: not a PhysicsNeMo checkpoint");
  }
  MdlusFile f;
  f.path = path;
  const auto args = parse_json(entries.at("args.json"), path + ": args.json");
  for (const char* key : {"__name__", "__module__", "__args__"}) {
    TORCH_CHECK(args.contains(key), "'", path, "': args.json has no '", key, "'");
  }
  for (const char* key : {"__name__", "__module__"}) {
    TORCH_CHECK(args.at(key).is_string(), "'", path, "': args.json's '", key, "' is not a string");
  }
  TORCH_CHECK(args.at("__args__").is_object(), "'", path,
              "': args.json's '__args__' is not an object");
  f.class_name = args.at("__name__").get<std::string>();
  f.module = args.at("__module__").get<std::string>();
  f.args = args.at("__args__");
  f.metadata = nlohmann::json::object();  // older PhysicsNeMo wrote none
  if (auto it = entries.find("metadata.json"); it != entries.end()) {
    f.metadata = parse_json(it->second, path + ": metadata.json");
    TORCH_CHECK(f.metadata.is_object(), "'", path, "': metadata.json is not an object");
  }
  f.state = read_torch_state_dict(entries.at("model.pt"), path + ": model.pt");
  return f;
}

void load_mdlus_weights(Model& model, const MdlusFile& file) {
  TORCH_CHECK(model.class_name() == file.class_name, "'", file.path, "' holds a ", file.class_name,
              "; the config builds a ", model.class_name());
  const auto diff = differing_args(model.physicsnemo_args(), file.args);
  if (!diff.empty()) {
    std::string list;
    for (const auto& d : diff) list += "\n  " + d;
    TORCH_CHECK(false, "'", file.path, "': the config's model differs from the checkpoint's ",
                "args.json (config vs file):", list,
                "\nset the model.* keys to the file's values (functional_dim, embedding_dim and ",
                "out_dim follow from model.inputs and dataset.targets)");
  }
  std::map<std::string, torch::Tensor> named(file.state.begin(), file.state.end());
  std::set<std::string> ours;
  for (const auto& p : model.named_parameters()) ours.insert(p.key());
  std::string extra;
  for (const auto& [name, t] : named) {
    if (!ours.count(name)) extra += (extra.empty() ? "" : ", ") + name;
  }
  TORCH_CHECK(extra.empty(), "'", file.path, "': model.pt holds tensors the ", model.class_name(),
              " does not have: ", extra);
  try {
    model.load_named(named);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "'", file.path, "': ", e.what_without_backtrace());
  }
}

ModelPtr build_from_mdlus(const MdlusFile& file) {
  ModelPtr model = build_model_from_physicsnemo(file.class_name, file.args, file.path);
  load_mdlus_weights(*model, file);
  return model;
}

void write_mdlus(const std::string& path, Model& model) {
  NamedTensors state;
  for (const auto& p : model.named_parameters()) {
    state.emplace_back(p.key(), p.value().detach().to(torch::kCPU, torch::kFloat).contiguous());
  }
  const nlohmann::json args = {{"__name__", model.class_name()},
                               {"__module__", model.physicsnemo_module()},
                               {"__args__", model.physicsnemo_args()}};
  const nlohmann::json metadata = {{"physicsnemo_version", nullptr},
                                   {"mdlus_file_version", "0.1.0"}};
  write_file_atomically(path, write_zip({{"model.pt", write_torch_state_dict(state, "model")},
                                         {"args.json", args.dump()},
                                         {"metadata.json", metadata.dump()}},
                                        /*alignment=*/1));
}

}  // namespace slipstream::aero
