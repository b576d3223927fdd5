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

namespace {
// The manifest's splits, each a list of sample files relative to `dir`.
// Accepts Slipstream's {"format": ..., "train": [...], ...} and the recipe's
// {"train": [runs], "val": [...], "test": [...]}, whose entries name runs:
// "run_1" is found as run_1 or run_1.safetensors.
std::map<std::string, std::vector<std::string>> read_manifest(const std::string& dir) {
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
  TORCH_CHECK(manifest.is_object(), "dataset: '", manifest_path, "' is not a JSON object");
  if (manifest.contains("format")) {
    TORCH_CHECK(manifest["format"] == kFormat, "dataset: '", manifest_path, "' has format '",
                manifest["format"].dump(), "', expected '", kFormat, "'");
  }
  std::map<std::string, std::vector<std::string>> splits;
  for (const auto& [split, entries] : manifest.items()) {
    if (split == "format" || split == "source") continue;
    TORCH_CHECK(entries.is_array(), "dataset: '", manifest_path, "' split '", split,
                "' must be a list of samples");
    auto& files = splits[split];
    for (const auto& e : entries) {
      TORCH_CHECK(e.is_string(), "dataset: '", manifest_path, "' split '", split,
                  "' holds a non-string entry ", e.dump());
      const auto name = e.get<std::string>();
      if (fs::is_regular_file(dir + "/" + name)) {
        files.push_back(name);
      } else if (fs::is_regular_file(dir + "/" + name + ".safetensors")) {
        files.push_back(name + ".safetensors");
      } else {
        TORCH_CHECK(false, "dataset: '", manifest_path, "' lists '", name, "' in '", split,
                    "', which does not exist");
      }
    }
  }
  return splits;
}

std::string join_names(const std::map<std::string, std::vector<std::string>>& splits) {
  std::string out;
  for (const auto& [name, files] : splits) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "none" : out;
}
}  // namespace

std::vector<std::string> split_names(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& [name, files] : read_manifest(dir)) out.push_back(name);
  return out;
}

std::shared_ptr<Dataset> open_split(const std::string& dir, const std::string& split) {
  const auto splits = read_manifest(dir);
  auto it = splits.find(split);
  TORCH_CHECK(it != splits.end(), "dataset: '", dir, "/manifest.json' has no split '", split,
              "' (it has: ", join_names(splits), ")");
  return std::make_shared<DirectoryDataset>(dir, it->second);
}

DatasetSplits open_sample_directory(const std::string& dir) {
  const auto splits = read_manifest(dir);
  auto train = splits.find("train");
  TORCH_CHECK(train != splits.end() && !train->second.empty(), "dataset: '", dir,
              "/manifest.json' lists no train samples (it has: ", join_names(splits), ")");
  auto val = splits.find("val");
  DatasetSplits out;
  out.train = std::make_shared<DirectoryDataset>(dir, train->second);
  out.val = std::make_shared<DirectoryDataset>(
      dir, val != splits.end() ? val->second : std::vector<std::string>{});
  return out;
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
