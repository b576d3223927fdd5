#include "aero/data/dataset.h"

#include "aero/data/manifest.h"
#include "core/io/atomic_file.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <utility>

namespace slipstream::aero {

namespace fs = std::filesystem;

int64_t block_start(int64_t n, int64_t k, const PointRequest& r) {
  TORCH_CHECK(n > 0 && k > 0, "dataset: a block of ", k, " of ", n, " rows");
  uint64_t z = r.sample_seed + 0x9E3779B97F4A7C15ULL;  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  const auto un = static_cast<unsigned __int128>(n);
  const auto epoch = static_cast<unsigned __int128>(static_cast<uint64_t>(r.epoch));
  return static_cast<int64_t>((z % un + epoch * static_cast<uint64_t>(k)) % un);
}

SyntheticDataset::SyntheticDataset(SyntheticOptions options, int64_t first_index, size_t count)
    : options_(std::move(options)), first_(first_index), count_(count) {}

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

Sample DirectoryDataset::get(size_t index, const PointRequest& request) const {
  TORCH_CHECK(index < files_.size(), "dataset: index ", index, " out of range");
  const SampleFile file(dir_ + "/" + files_[index]);
  const int64_t n = file.rows(), k = request.max_points;
  Sample s;
  if (k > 0 && k < n && file.permuted()) {
    s = file.read_block(block_start(n, k, request), k);
  } else {
    if (k > 0 && k < n && !noted_old_format_.exchange(true)) {
      std::cerr << "dataset: note: '" << file.path()
                << "' was written before slipstream-samples-v2, so every step reads whole "
                   "samples; re-run prepare (or make-synthetic --out) to read only the points "
                   "a step keeps\n";
    }
    s = file.read_all();
  }
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
  for (const auto& name : files_) {
    const SampleFile file(dir_ + "/" + name);
    check_layout(file.layout(), check_, file.path());
    // Finiteness was checked when the file was written.
    for (const auto& [field, channels] : check_.required.point_channels) {
      if (!file.nonfinite().count(field)) continue;
      const bool target =
          std::find(check_.targets.begin(), check_.targets.end(), field) != check_.targets.end();
      TORCH_CHECK(target && check_.allow_nonfinite_targets, "dataset: sample ", file.path(),
                  " field '", field, "' holds non-finite values (NaN or Inf)",
                  target ? "; set the loss to mask them or fix the data" : "");
    }
  }
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
  manifest["format"] = kSampleFormat;
  manifest["source"] =
      "synthetic potential flow past spheres, seed " + std::to_string(options.seed);
  manifest["train"] = nlohmann::json::array();
  manifest["val"] = nlohmann::json::array();
  for (int64_t i = 0; i < num_train + num_val; ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "sample_%05lld.safetensors", static_cast<long long>(i));
    write_sample_file(dir + "/" + name, make_synthetic_sample(i, options));
    manifest[i < num_train ? "train" : "val"].push_back(name);
    record_checksum(manifest, dir, name);
  }
  write_file_atomically(dir + "/manifest.json", manifest.dump(2) + "\n");
}

}  // namespace slipstream::aero
