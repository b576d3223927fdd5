// Datasets of CFD samples, split into train and val.
//
// SyntheticDataset generates samples in memory (see synthetic.h) and caches
// them. DirectoryDataset reads a directory written by `slipstream
// make-synthetic --out DIR` (or `prepare`): a manifest.json
//   {"format": "slipstream-samples-v1", "train": ["a.safetensors", ...],
//    "val": [...]}
// and one safetensors file per sample holding points, sdf, sdf_normals,
// U_inf, the target fields and optionally volume. Files are memory-mapped
// (the OS pages in what a step touches). Every problem names the file.
#pragma once

#include "aero/data/sample.h"
#include "aero/data/synthetic.h"

#include <nlohmann/json_fwd.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace slipstream::aero {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual size_t size() const = 0;
  // Thread-safe; validated against `target_names`.
  virtual Sample get(size_t index) const = 0;
  virtual std::string describe() const = 0;
};

struct DatasetSplits {
  std::shared_ptr<Dataset> train, val;
};

class SyntheticDataset : public Dataset {
 public:
  SyntheticDataset(SyntheticOptions options, int64_t first_index, size_t count,
                   std::vector<std::string> target_names);
  size_t size() const override { return count_; }
  Sample get(size_t index) const override;
  std::string describe() const override;

 private:
  SyntheticOptions options_;
  int64_t first_;
  size_t count_;
  std::vector<std::string> target_names_;
  mutable std::mutex mutex_;
  mutable std::map<size_t, Sample> cache_;
};

class DirectoryDataset : public Dataset {
 public:
  DirectoryDataset(std::string dir, std::vector<std::string> files,
                   std::vector<std::string> target_names);
  size_t size() const override { return files_.size(); }
  Sample get(size_t index) const override;
  std::string describe() const override;

 private:
  std::string dir_;
  std::vector<std::string> files_;
  std::vector<std::string> target_names_;
};

// Opens `dir`'s manifest; throws naming the directory or file on any problem.
DatasetSplits open_sample_directory(const std::string& dir,
                                    const std::vector<std::string>& target_names);

// Reads and validates one sample file.
Sample read_sample_file(const std::string& path, const std::vector<std::string>& target_names);
// Writes one sample file atomically.
void write_sample_file(const std::string& path, const Sample& sample);

// Writes `num_train` + `num_val` synthetic samples and the manifest to `dir`.
void write_synthetic_directory(const std::string& dir, const SyntheticOptions& options,
                               int64_t num_train, int64_t num_val);

}  // namespace slipstream::aero
