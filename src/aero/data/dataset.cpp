#include "aero/data/dataset.h"

#include "core/io/atomic_file.h"
#include "core/io/safetensors.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace slipstream::aero {

namespace fs = std::filesystem;

namespace {
constexpr const char* kFormat = "slipstream-samples-v1";

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
  return "synthetic potential flow past spheres: " + std::to_string(count_) + " samples of " +
         std::to_string(options_.points_per_sample) + " points, seed " +
         std::to_string(options_.seed);
}

SampleLayout SyntheticDataset::layout() const { return synthetic_layout(); }

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

void DirectoryDataset::check_headers() const {
  for (const auto& file : files_) {
    const std::string path = dir_ + "/" + file;
    const SampleLayout have = read_sample_layout(path);
    for (const auto& [name, channels] : check_.required.point_channels) {
      auto it = have.point_channels.find(name);
      TORCH_CHECK(it != have.point_channels.end(), "dataset: sample ", path,
                  " has no point field '", name, "'");
      TORCH_CHECK(it->second == channels, "dataset: sample ", path, " point field '", name,
                  "' has ", it->second, " channels, expected ", channels);
    }
    for (const auto& [name, size] : check_.required.global_sizes) {
      auto it = have.global_sizes.find(name);
      TORCH_CHECK(it != have.global_sizes.end(), "dataset: sample ", path, " has no global '", name,
                  "'");
      TORCH_CHECK(it->second == size, "dataset: sample ", path, " global '", name, "' has ",
                  it->second, " values, expected ", size);
    }
  }
}

Sample read_sample_file(const std::string& path) {
  const auto f = read_safetensors(path);
  const auto globals = globals_of(f);
  Sample s;
  s.id = path;
  for (const auto& [name, t] : f.tensors) {
    if (globals.count(name)) {
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
  write_safetensors(path, tensors, {{"id", s.id}, {"format", kFormat}, {"globals", globals}});
}

DatasetSplits open_sample_directory(const std::string& dir) {
  TORCH_CHECK(fs::is_directory(dir), "dataset: directory '", dir, "' does not exist");
  const std::string manifest_path = dir + "/manifest.json";
  std::ifstream in(manifest_path);
  TORCH_CHECK(in.good(), "dataset: '", manifest_path,
              "' is missing; write the directory with `slipstream make-synthetic --out ", dir,
              "` or `slipstream prepare`");
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "dataset: '", manifest_path, "' is not valid JSON: ", e.what());
  }
  TORCH_CHECK(manifest.value("format", "") == kFormat, "dataset: '", manifest_path,
              "' has format '", manifest.value("format", ""), "', expected '", kFormat, "'");
  auto files_of = [&](const char* split) {
    TORCH_CHECK(manifest.contains(split) && manifest[split].is_array(), "dataset: '", manifest_path,
                "' has no '", split, "' list");
    auto files = manifest[split].get<std::vector<std::string>>();
    for (const auto& f : files) {
      TORCH_CHECK(fs::is_regular_file(dir + "/" + f), "dataset: '", manifest_path, "' lists '", f,
                  "', which does not exist");
    }
    return files;
  };
  DatasetSplits splits;
  splits.train = std::make_shared<DirectoryDataset>(dir, files_of("train"));
  splits.val = std::make_shared<DirectoryDataset>(dir, files_of("val"));
  TORCH_CHECK(splits.train->size() > 0, "dataset: '", manifest_path, "' lists no train samples");
  return splits;
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
