#include "aero/data/dataset.h"

#include "core/io/atomic_file.h"
#include "core/io/safetensors.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace slipstream::aero {

namespace fs = std::filesystem;

namespace {
constexpr const char* kFormat = "slipstream-samples-v1";
// A surface sample's polygons are stored as mesh/vertices, mesh/offsets,
// mesh/connectivity.
constexpr const char* kMeshPrefix = "mesh/";

// Files written before globals were listed in their metadata hold these.
const std::set<std::string>& known_globals() {
  static const std::set<std::string> names{"U_inf", "rho_inf", "p_inf", "L_ref", "A_ref", "nu"};
  return names;
}

std::set<std::string> globals_of(const SafetensorsFile& f) {
  auto it = f.metadata.find("globals");
  if (it == f.metadata.end()) return known_globals();
  std::set<std::string> out;
  std::stringstream ss(it->second);
  for (std::string name; std::getline(ss, name, ',');) {
    if (!name.empty()) out.insert(name);
  }
  return out;
}
}  // namespace

SyntheticDataset::SyntheticDataset(SyntheticOptions options, int64_t first_index, size_t count)
    : options_(options), first_(first_index), count_(count) {}

Sample SyntheticDataset::get(size_t index) const {
  TORCH_CHECK(index < count_, "dataset: index ", index, " out of range (", count_, " samples)");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(index);
    if (it != cache_.end()) return it->second;
  }
  Sample s = make_synthetic_sample(first_ + static_cast<int64_t>(index), options_);
  check_(s);
  std::lock_guard<std::mutex> lock(mutex_);
  cache_.emplace(index, s);
  return s;
}

std::string SyntheticDataset::describe() const {
  return "synthetic potential flow past spheres: " + std::to_string(count_) + " " + options_.kind +
         " samples of " + std::to_string(options_.points_per_sample) +
         (options_.kind == "surface" ? " cells" : " points") + ", seed " +
         std::to_string(options_.seed);
}

SampleLayout SyntheticDataset::layout() const { return synthetic_layout(options_.kind); }

DirectoryDataset::DirectoryDataset(std::string dir, std::vector<std::string> files)
    : dir_(std::move(dir)), files_(std::move(files)) {}

Sample DirectoryDataset::get(size_t index) const {
  TORCH_CHECK(index < files_.size(), "dataset: index ", index, " out of range");
  Sample s = read_sample_file(dir_ + "/" + files_[index]);
  check_(s);
  return s;
}

std::string DirectoryDataset::describe() const {
  return dir_ + ": " + std::to_string(files_.size()) + " samples";
}

SampleLayout DirectoryDataset::layout() const {
  TORCH_CHECK(!files_.empty(), "dataset: '", dir_, "' lists no samples");
  return read_sample_layout(dir_ + "/" + files_.front());
}

void check_layout(const SampleLayout& have, const SampleCheck& check, const std::string& path) {
  for (const auto& [name, channels] : check.required.point_channels) {
    auto it = have.point_channels.find(name);
    TORCH_CHECK(it != have.point_channels.end(), "dataset: sample ", path, " has no point field '",
                name, "'");
    TORCH_CHECK(it->second == channels, "dataset: sample ", path, " point field '", name, "' has ",
                it->second, " channels, expected ", channels);
  }
  for (const auto& [name, size] : check.required.global_sizes) {
    auto it = have.global_sizes.find(name);
    TORCH_CHECK(it != have.global_sizes.end(), "dataset: sample ", path, " has no global '", name,
                "'");
    TORCH_CHECK(it->second == size, "dataset: sample ", path, " global '", name, "' has ",
                it->second, " values, expected ", size);
  }
}

void DirectoryDataset::check_headers() const {
  for (const auto& file : files_) {
    const std::string path = dir_ + "/" + file;
    check_layout(read_sample_layout(path), check_, path);
  }
}

Sample read_sample_file(const std::string& path) {
  const auto f = read_safetensors(path);
  const auto globals = globals_of(f);
  Sample s;
  s.id = path;
  for (const auto& [name, t] : f.tensors) {
    if (name.rfind(kMeshPrefix, 0) == 0) {
      s.mesh[name.substr(std::strlen(kMeshPrefix))] = t;
    } else if (globals.count(name)) {
      s.global_data[name] = name == "U_inf" ? t.to(torch::kFloat).reshape({-1}) : t.reshape({-1});
    } else {
      auto x = t.to(torch::kFloat);
      s.point_data[name] = x.dim() == 1 ? x.unsqueeze(1) : x;
    }
  }
  TORCH_CHECK(s.has_point("points"), "dataset: sample file '", path, "' holds no 'points'");
  return s;
}

SampleLayout read_sample_layout(const std::string& path) {
  const auto f = read_safetensors(path);
  const auto globals = globals_of(f);
  SampleLayout out;
  for (const auto& [name, t] : f.tensors) {
    if (name.rfind(kMeshPrefix, 0) == 0) continue;
    if (globals.count(name)) {
      out.global_sizes[name] = t.numel();
    } else {
      out.point_channels[name] = t.dim() == 2 ? t.size(1) : 1;
    }
  }
  return out;
}

void write_sample_file(const std::string& path, const Sample& s) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, t] : s.point_data) tensors.emplace_back(name, t);
  std::string globals;
  for (const auto& [name, t] : s.global_data) {
    tensors.emplace_back(name, t);
    globals += (globals.empty() ? "" : ",") + name;
  }
  for (const auto& [name, t] : s.mesh) tensors.emplace_back(kMeshPrefix + name, t);
  write_safetensors(path, tensors, {{"id", s.id}, {"format", kFormat}, {"globals", globals}});
}

ConcatDataset::ConcatDataset(std::vector<std::shared_ptr<Dataset>> parts)
    : parts_(std::move(parts)) {
  TORCH_CHECK(!parts_.empty(), "dataset: a concatenation needs at least one dataset");
}

size_t ConcatDataset::size() const {
  size_t n = 0;
  for (const auto& p : parts_) n += p->size();
  return n;
}

std::pair<const Dataset*, size_t> ConcatDataset::locate(size_t index) const {
  for (const auto& p : parts_) {
    if (index < p->size()) return {p.get(), index};
    index -= p->size();
  }
  TORCH_CHECK(false, "dataset: index out of range (", size(), " samples)");
  return {nullptr, 0};  // not reached
}

Sample ConcatDataset::get(size_t index) const {
  const auto [part, i] = locate(index);
  return part->get(i);
}

Sample ConcatDataset::get(size_t index, const PointRequest& request) const {
  const auto [part, i] = locate(index);
  return part->get(i, request);
}

std::string ConcatDataset::describe() const {
  std::string out;
  for (const auto& p : parts_) out += (out.empty() ? "" : " + ") + p->describe();
  return out;
}

SampleLayout ConcatDataset::layout() const {
  for (const auto& p : parts_) {
    if (p->size() > 0) return p->layout();
  }
  return parts_.front()->layout();
}

void ConcatDataset::check_headers() const {
  for (const auto& p : parts_) p->check_headers();
}

void ConcatDataset::set_check(SampleCheck check) {
  for (const auto& p : parts_) p->set_check(check);
  check_ = std::move(check);
}

void write_synthetic_directory(const std::string& dir, const SyntheticOptions& options,
                               int64_t num_train, int64_t num_val) {
  TORCH_CHECK(num_train > 0 && num_val >= 0, "make-synthetic: need num_train > 0 and num_val >= 0");
  fs::create_directories(dir);
  nlohmann::json manifest;
  manifest["format"] = kFormat;
  manifest["source"] =
      "synthetic potential flow past spheres, seed " + std::to_string(options.seed);
  manifest["train"] = nlohmann::json::array();
  manifest["val"] = nlohmann::json::array();
  for (int64_t i = 0; i < num_train + num_val; ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "sample_%05lld.safetensors", static_cast<long long>(i));
    write_sample_file(dir + "/" + name, make_synthetic_sample(i, options));
    manifest[i < num_train ? "train" : "val"].push_back(name);
  }
  write_file_atomically(dir + "/manifest.json", manifest.dump(2) + "\n");
}

}  // namespace slipstream::aero
