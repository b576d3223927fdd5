#include "aero/run/checkpoint.h"

#include "core/io/crc32c.h"
#include "core/io/safetensors.h"

#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>
#include <tuple>

namespace slipstream::aero {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "checkpoint_epoch_";
constexpr const char* kSuffix = ".safetensors";
constexpr const char* kFormat = "slipstream-checkpoint-v3";
constexpr const char* kFormatV2 = "slipstream-checkpoint-v2";  // no header checksum
constexpr const char* kFormatV1 = "slipstream-checkpoint-v1";  // no checksums
constexpr const char* kHeaderChecksum = "header_checksum";

uint32_t checksum(const at::Tensor& cpu) {
  return crc32c(cpu.data_ptr(), cpu.numel() * cpu.element_size());
}

// The CRC-32C of every metadata entry but the header checksum itself, in key
// order, each as key NUL value NUL: the run's position, its statistics and
// the tensors' checksums are covered like the tensors are.
uint32_t header_checksum(const std::map<std::string, std::string>& metadata) {
  std::string text;
  for (const auto& [key, value] : metadata) {
    if (key == kHeaderChecksum) continue;
    text += key;
    text += '\0';
    text += value;
    text += '\0';
  }
  return crc32c(text.data(), text.size());
}

// (epochs done, steps into the next) from a file name, or nullopt.
std::optional<std::pair<int64_t, int64_t>> order_of(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0 || name.size() <= std::string(kSuffix).size() ||
      name.compare(name.size() - std::string(kSuffix).size(), std::string::npos, kSuffix) != 0) {
    return std::nullopt;
  }
  // "<E>" or "<E>_step_<S>" between the prefix and the suffix, digits only.
  const std::string core =
      name.substr(std::string(kPrefix).size(),
                  name.size() - std::string(kPrefix).size() - std::string(kSuffix).size());
  const auto digits = [](const std::string& s) {
    return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
  };
  const auto mark = core.find("_step_");
  const std::string epoch = core.substr(0, mark);
  const std::string step = mark == std::string::npos ? "0" : core.substr(mark + 6);
  if (!digits(epoch) || !digits(step)) return std::nullopt;
  return std::make_pair(std::stoll(epoch), std::stoll(step));
}

int64_t meta_int(const SafetensorsFile& f, const std::string& key, int64_t fallback) {
  auto it = f.metadata.find(key);
  return it == f.metadata.end() ? fallback : std::stoll(it->second);
}

// Every difference between the file's tensors and what the model and
// optimizer hold; empty when they agree.
std::vector<std::string> mismatches(const std::map<std::string, at::Tensor>& file,
                                    const std::vector<std::pair<std::string, at::Tensor>>& expected,
                                    const std::string& prefix) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& [name, want] : expected) {
    const std::string key = prefix + name;
    seen.insert(key);
    auto it = file.find(key);
    if (it == file.end()) {
      out.push_back("missing '" + key + "' " + c10::str(want.sizes()));
      continue;
    }
    if (it->second.sizes() != want.sizes()) {
      out.push_back("'" + key + "' has shape " + c10::str(it->second.sizes()) + ", expected " +
                    c10::str(want.sizes()));
    } else if (it->second.scalar_type() != want.scalar_type()) {
      out.push_back("'" + key + "' has dtype " + c10::toString(it->second.scalar_type()) +
                    ", expected " + c10::toString(want.scalar_type()));
    }
  }
  for (const auto& [key, t] : file) {
    if (key.rfind(prefix, 0) == 0 && !seen.count(key)) {
      out.push_back("unexpected '" + key + "' " + c10::str(t.sizes()));
    }
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> model_tensors(Model& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : model.named_parameters()) out.emplace_back(p.key(), p.value());
  return out;
}

}  // namespace

std::string save_checkpoint(const std::string& dir, const TrainPosition& pos, Model& model,
                            const MuonAdamW& optimizer,
                            const std::map<std::string, std::string>& metadata) {
  fs::create_directories(dir);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, t] : model_tensors(model)) tensors.emplace_back("model." + name, t);
  for (const auto& [name, t] : optimizer.state_tensors()) tensors.emplace_back("optim." + name, t);
  nlohmann::json checksums = nlohmann::json::object();
  for (auto& [name, t] : tensors) {
    t = t.detach().to(at::kCPU).contiguous();
    if (t.is_floating_point()) {
      TORCH_CHECK(torch::isfinite(t).all().item<bool>(), "checkpoint: '", name,
                  "' holds a non-finite value; not saving a checkpoint of this state");
    }
    checksums[name] = checksum(t);
  }
  char name[96];
  if (pos.steps_into_epoch > 0) {
    std::snprintf(name, sizeof(name), "%s%04lld_step_%06lld%s", kPrefix,
                  static_cast<long long>(pos.epochs_done),
                  static_cast<long long>(pos.steps_into_epoch), kSuffix);
  } else {
    std::snprintf(name, sizeof(name), "%s%04lld%s", kPrefix,
                  static_cast<long long>(pos.epochs_done), kSuffix);
  }
  std::string path = dir + "/" + name;
  auto meta = metadata;
  meta["format"] = kFormat;
  meta["epoch"] = std::to_string(pos.epochs_done);
  meta["steps_into_epoch"] = std::to_string(pos.steps_into_epoch);
  meta["global_step"] = std::to_string(pos.global_step);
  meta["val_step"] = std::to_string(pos.val_step);
  if (!pos.epoch_means.is_null()) meta["epoch_means"] = pos.epoch_means.dump();
  meta["checksums"] = checksums.dump();
  meta[kHeaderChecksum] = std::to_string(header_checksum(meta));
  write_safetensors(path, tensors, meta);
  return path;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::tuple<int64_t, int64_t, std::string>> found;
  if (!fs::is_directory(dir)) return {};
  for (const auto& e : fs::directory_iterator(dir)) {
    if (auto order = order_of(e.path().filename().string())) {
      found.emplace_back(order->first, order->second, e.path().string());
    }
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  std::vector<std::string> out;
  out.reserve(found.size());
  for (auto& f : found) out.push_back(std::get<2>(f));
  return out;
}

CheckpointFile read_checkpoint(const std::string& path) {
  SafetensorsFile f;
  try {
    f = read_safetensors(path);
  } catch (const c10::Error& e) {
    throw CheckpointDamaged("checkpoint: '" + path + "' is damaged: " + e.what_without_backtrace());
  }
  const auto format = f.metadata.count("format") ? f.metadata.at("format") : "";
  if (format != kFormat && format != kFormatV2 && format != kFormatV1) {
    throw CheckpointDamaged("checkpoint: '" + path + "' is not a Slipstream checkpoint (format '" +
                            format + "')");
  }
  std::map<std::string, at::Tensor> tensors(f.tensors.begin(), f.tensors.end());
  if (format == kFormat) {
    const auto it = f.metadata.find(kHeaderChecksum);
    if (it == f.metadata.end() || it->second != std::to_string(header_checksum(f.metadata))) {
      throw CheckpointDamaged("checkpoint: '" + path +
                              "' is damaged: its header (the run's position, the fields' "
                              "statistics, the tensors' checksums) does not match its checksum");
    }
  }
  if (format == kFormat || format == kFormatV2) {
    nlohmann::json sums;
    try {
      sums = nlohmann::json::parse(f.metadata.at("checksums"));
    } catch (const std::exception& e) {
      throw CheckpointDamaged("checkpoint: '" + path + "' has no readable checksums");
    }
    for (const auto& [name, t] : tensors) {
      if (!sums.contains(name) || sums[name].get<uint32_t>() != checksum(t.contiguous())) {
        throw CheckpointDamaged("checkpoint: '" + path + "' is damaged: tensor '" + name +
                                "' does not match its checksum");
      }
    }
    // A tensor that was written is there: one missing is damage, not
    // another config.
    for (const auto& [name, sum] : sums.items()) {
      if (!tensors.count(name)) {
        throw CheckpointDamaged("checkpoint: '" + path + "' is damaged: tensor '" + name +
                                "' was written but is missing");
      }
    }
  }
  CheckpointInfo info;
  info.path = path;
  info.position.epochs_done = meta_int(f, "epoch", 0);
  info.position.steps_into_epoch = meta_int(f, "steps_into_epoch", 0);
  info.position.global_step = meta_int(f, "global_step", 0);
  info.position.val_step = meta_int(f, "val_step", 0);
  if (f.metadata.count("epoch_means")) {
    info.position.epoch_means = nlohmann::json::parse(f.metadata.at("epoch_means"));
  }
  info.metadata = f.metadata;
  CheckpointFile file;
  file.info = std::move(info);
  file.tensors = std::move(tensors);
  return file;
}

void apply_checkpoint(const CheckpointFile& file, Model* model, MuonAdamW* optimizer) {
  const std::string& path = file.info.path;
  const auto& tensors = file.tensors;
  std::vector<std::string> diff;
  if (model != nullptr) {
    for (auto& d : mismatches(tensors, model_tensors(*model), "model.")) diff.push_back(d);
  }
  if (optimizer != nullptr) {
    for (auto& d : mismatches(tensors, optimizer->state_tensors(), "optim.")) diff.push_back(d);
  }
  if (!diff.empty()) {
    std::string list;
    for (const auto& d : diff) list += "\n  " + d;
    throw CheckpointMismatch("checkpoint: '" + path +
                             "' was written by a run of another config (model or optimizer); " +
                             std::to_string(diff.size()) + " difference(s):" + list +
                             "\nNothing was loaded or overwritten. Resume with the config it was "
                             "written with (resolved_config.yaml beside it), or train under "
                             "another run_id.");
  }
  torch::NoGradGuard no_grad;
  if (model != nullptr) {
    for (auto& p : model->named_parameters()) p.value().copy_(tensors.at("model." + p.key()));
  }
  if (optimizer != nullptr) {
    std::map<std::string, at::Tensor> state;
    for (const auto& [name, t] : tensors) {
      if (name.rfind("optim.", 0) == 0) state[name.substr(6)] = t;
    }
    optimizer->load_state_tensors(state);
  }
}

CheckpointInfo load_checkpoint(const std::string& path, Model* model, MuonAdamW* optimizer) {
  CheckpointFile file = read_checkpoint(path);
  apply_checkpoint(file, model, optimizer);
  return std::move(file.info);
}

std::optional<CheckpointFile> read_newest_checkpoint(const std::string& path) {
  if (fs::is_regular_file(path)) return read_checkpoint(path);
  const auto candidates = list_checkpoints(path);
  std::string damaged;
  for (const auto& candidate : candidates) {
    try {
      return read_checkpoint(candidate);
    } catch (const CheckpointDamaged& e) {
      std::cerr << "slipstream: " << e.what() << "; trying the one before it\n";
      damaged += std::string("\n  ") + e.what();
    }
  }
  if (candidates.empty()) return std::nullopt;
  throw CheckpointDamaged("checkpoint: every checkpoint in '" + path + "' is damaged:" + damaged +
                          "\nNothing was loaded; training does not start over on its own (move "
                          "them away, or set training.start_over=true).");
}

std::optional<CheckpointInfo> load_newest_checkpoint(const std::string& path, Model* model,
                                                     MuonAdamW* optimizer) {
  auto file = read_newest_checkpoint(path);
  if (!file) return std::nullopt;
  apply_checkpoint(*file, model, optimizer);
  return std::move(file->info);
}

void prune_checkpoints(const std::string& dir, int64_t keep) {
  const auto all = list_checkpoints(dir);
  for (size_t i = static_cast<size_t>(std::max<int64_t>(keep, 1)); i < all.size(); ++i) {
    if (std::remove(all[i].c_str()) != 0) {
      std::cerr << "slipstream: cannot prune '" << all[i] << "': " << std::strerror(errno) << "\n";
    }
  }
}

}  // namespace slipstream::aero
