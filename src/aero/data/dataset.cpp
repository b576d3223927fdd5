#include "aero/data/dataset.h"

#include "core/io/safetensors.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

namespace slipstream::aero {

namespace fs = std::filesystem;

namespace {
constexpr const char* kFormat = "slipstream-samples-v1";
}

SyntheticDataset::SyntheticDataset(SyntheticOptions options, int64_t first_index, size_t count,
                                   std::vector<std::string> target_names)
    : options_(options), first_(first_index), count_(count), target_names_(std::move(target_names)) {}

Sample SyntheticDataset::get(size_t index) const {
  TORCH_CHECK(index < count_, "dataset: index ", index, " out of range (", count_, " samples)");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(index);
    if (it != cache_.end()) return it->second;
  }
  Sample s = make_synthetic_sample(first_ + static_cast<int64_t>(index), options_);
  validate_sample(s, target_names_);
  std::lock_guard<std::mutex> lock(mutex_);
  cache_.emplace(index, s);
  return s;
}

std::string SyntheticDataset::describe() const {
  return "synthetic potential flow past spheres: " + std::to_string(count_) + " samples of " +
         std::to_string(options_.points_per_sample) + " points, seed " +
         std::to_string(options_.seed);
}

DirectoryDataset::DirectoryDataset(std::string dir, std::vector<std::string> files,
                                   std::vector<std::string> target_names)
    : dir_(std::move(dir)), files_(std::move(files)), target_names_(std::move(target_names)) {}

Sample DirectoryDataset::get(size_t index) const {
  TORCH_CHECK(index < files_.size(), "dataset: index ", index, " out of range");
  return read_sample_file(dir_ + "/" + files_[index], target_names_);
}

std::string DirectoryDataset::describe() const {
  return dir_ + ": " + std::to_string(files_.size()) + " samples";
}

Sample read_sample_file(const std::string& path, const std::vector<std::string>& target_names) {
  const auto f = read_safetensors(path);
  Sample s;
  s.id = path;
  auto get = [&](const char* name) -> torch::Tensor {
    return f.contains(name) ? f.at(name).to(torch::kFloat) : torch::Tensor();
  };
  s.points = get("points");
  s.sdf = get("sdf");
  s.sdf_normals = get("sdf_normals");
  s.u_inf = get("U_inf");
  s.volume = get("volume");
  for (const auto& name : target_names) {
    auto t = get(name.c_str());
    if (t.defined()) s.targets[name] = t.dim() == 1 ? t.unsqueeze(1) : t;
  }
  if (s.sdf.defined() && s.sdf.dim() == 1) s.sdf = s.sdf.unsqueeze(1);
  if (f.contains("rho_inf")) s.rho_inf = f.at("rho_inf").to(torch::kDouble).item<double>();
  if (f.contains("p_inf")) s.p_inf = f.at("p_inf").to(torch::kDouble).item<double>();
  validate_sample(s, target_names);
  return s;
}

void write_sample_file(const std::string& path, const Sample& s) {
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"points", s.points}, {"sdf", s.sdf}, {"sdf_normals", s.sdf_normals}, {"U_inf", s.u_inf}};
  for (const auto& [name, t] : s.targets) tensors.emplace_back(name, t);
  if (s.volume.defined()) tensors.emplace_back("volume", s.volume);
  tensors.emplace_back("rho_inf", torch::tensor({s.rho_inf}, torch::kDouble));
  tensors.emplace_back("p_inf", torch::tensor({s.p_inf}, torch::kDouble));
  write_safetensors(path, tensors, {{"id", s.id}, {"format", kFormat}});
}

DatasetSplits open_sample_directory(const std::string& dir,
                                    const std::vector<std::string>& target_names) {
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
    TORCH_CHECK(manifest.contains(split) && manifest[split].is_array(), "dataset: '",
                manifest_path, "' has no '", split, "' list");
    auto files = manifest[split].get<std::vector<std::string>>();
    for (const auto& f : files) {
      TORCH_CHECK(fs::is_regular_file(dir + "/" + f), "dataset: '", manifest_path, "' lists '", f,
                  "', which does not exist");
    }
    return files;
  };
  DatasetSplits splits;
  splits.train = std::make_shared<DirectoryDataset>(dir, files_of("train"), target_names);
  splits.val = std::make_shared<DirectoryDataset>(dir, files_of("val"), target_names);
  TORCH_CHECK(splits.train->size() > 0, "dataset: '", manifest_path, "' lists no train samples");
  return splits;
}

void write_synthetic_directory(const std::string& dir, const SyntheticOptions& options,
                               int64_t num_train, int64_t num_val) {
  TORCH_CHECK(num_train > 0 && num_val >= 0, "make-synthetic: need num_train > 0 and num_val >= 0");
  fs::create_directories(dir);
  nlohmann::json manifest;
  manifest["format"] = kFormat;
  manifest["source"] = "synthetic potential flow past spheres, seed " + std::to_string(options.seed);
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
