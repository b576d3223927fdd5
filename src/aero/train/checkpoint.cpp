#include "aero/train/checkpoint.h"

#include "core/io/safetensors.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>

namespace slipstream::aero {

namespace fs = std::filesystem;

namespace {
constexpr const char* kPrefix = "checkpoint_epoch_";
constexpr const char* kSuffix = ".safetensors";
constexpr const char* kFormat = "slipstream-checkpoint-v1";
}  // namespace

std::string save_checkpoint(const std::string& dir, int64_t epoch, int64_t global_step,
                            Model& model, const MuonAdamW& optimizer,
                            const std::map<std::string, std::string>& metadata) {
  fs::create_directories(dir);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& p : model.named_parameters())
    tensors.emplace_back("model." + p.key(), p.value());
  for (const auto& [k, v] : optimizer.state_tensors()) tensors.emplace_back("optim." + k, v);
  char name[64];
  std::snprintf(name, sizeof(name), "%s%04lld%s", kPrefix, static_cast<long long>(epoch), kSuffix);
  const std::string path = dir + "/" + name;
  auto meta = metadata;
  meta["format"] = kFormat;
  meta["epoch"] = std::to_string(epoch);
  meta["global_step"] = std::to_string(global_step);
  write_safetensors(path, tensors, meta);
  return path;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  if (!fs::is_directory(dir)) return {};
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0 || e.path().extension() != kSuffix) continue;
    try {
      found.emplace_back(std::stoll(name.substr(std::string(kPrefix).size())), e.path().string());
    } catch (const std::exception&) {
    }
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

CheckpointInfo load_checkpoint(const std::string& path, Model* model, MuonAdamW* optimizer) {
  const auto f = read_safetensors(path);
  TORCH_CHECK(f.metadata.count("format") && f.metadata.at("format") == kFormat, "checkpoint: '",
              path, "' is not a Slipstream checkpoint");
  std::map<std::string, torch::Tensor> model_tensors, optim_tensors;
  for (const auto& [name, t] : f.tensors) {
    if (name.rfind("model.", 0) == 0) model_tensors[name.substr(6)] = t;
    if (name.rfind("optim.", 0) == 0) optim_tensors[name.substr(6)] = t;
  }
  try {
    if (model != nullptr) model->load_named(model_tensors);
    if (optimizer != nullptr) optimizer->load_state_tensors(optim_tensors);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "checkpoint: '", path, "': ", e.what_without_backtrace());
  }
  CheckpointInfo info;
  info.path = path;
  info.epoch = std::stoll(f.metadata.at("epoch"));
  info.global_step = std::stoll(f.metadata.at("global_step"));
  info.metadata = f.metadata;
  return info;
}

std::optional<CheckpointInfo> load_newest_checkpoint(const std::string& path, Model* model,
                                                     MuonAdamW* optimizer) {
  if (fs::is_regular_file(path)) return load_checkpoint(path, model, optimizer);
  for (const auto& candidate : list_checkpoints(path)) {
    try {
      return load_checkpoint(candidate, model, optimizer);
    } catch (const c10::Error& e) {
      std::cerr << "slipstream: skipping damaged checkpoint: " << e.what_without_backtrace()
                << "\n";
    }
  }
  return std::nullopt;
}

std::optional<CheckpointInfo> read_checkpoint_info(const std::string& path) {
  return load_newest_checkpoint(path, nullptr, nullptr);
}

}  // namespace slipstream::aero
