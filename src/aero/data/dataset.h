// Datasets of CFD samples, split into train and val (opened by their
// source and manifest in dataset_source.h).
//
// SyntheticDataset generates samples in memory (see synthetic.h) and caches
// them. DirectoryDataset reads a directory written by `slipstream
// make-synthetic --out DIR` (or `prepare`): a manifest.json
//   {"format": "slipstream-samples-v1", "train": ["a.safetensors", ...],
//    "val": [...]}
// and one safetensors file per sample holding its point fields (points,
// sdf, sdf_normals, the targets, optionally volume) and its globals (U_inf,
// rho_inf, p_inf, L_ref). Files are memory-mapped (the OS pages in what a
// step touches). Every problem names the file.
//
// A dataset checks each sample it hands out against the SampleCheck it was
// given (the tensors a run needs, their shapes and finiteness).
#pragma once

#include "aero/data/sample.h"
#include "aero/data/sample_file.h"
#include "aero/data/synthetic.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace slipstream::aero {

// What every sample must hold; an empty check accepts any sample.
struct SampleCheck {
  SampleLayout required;
  std::vector<std::string> targets;
  bool allow_nonfinite_targets = false;
  void operator()(const Sample& s) const {
    validate_sample(s, required, targets, allow_nonfinite_targets);
  }
};

// The points the loader keeps of a sample: `max_points` of them (all when
// <= 0 or the sample has fewer), drawn by subsample_indices() (transforms.h)
// from a generator seeded with `seed` — or, from a file stored for sampling
// (sample_file.h), the block of `max_points` rows at block_start().
struct PointRequest {
  int64_t max_points = 0;
  std::string mode = "random";  // random | block
  uint64_t seed = 0;
  // The sample's own seed (the same every epoch) and the epoch, which
  // moves its block on.
  uint64_t sample_seed = 0;
  int64_t epoch = 0;
};

// The first row of the block of k of n rows a request reads: an offset
// drawn from the sample's seed plus epoch * k, modulo n. Consecutive epochs
// read consecutive blocks, so every ceil(n / k) epochs read every row.
int64_t block_start(int64_t n, int64_t k, const PointRequest& request);

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual size_t size() const = 0;
  // Thread-safe; checked against the dataset's SampleCheck.
  virtual Sample get(size_t index) const = 0;
  // Only the requested points, for a dataset that can read just those (and
  // derive fields such as the SDF for them alone); by default the whole
  // sample, which the loader subsamples with the same draw.
  virtual Sample get(size_t index, const PointRequest& request) const {
    (void)request;
    return get(index);
  }
  virtual std::string describe() const = 0;
  // The tensors its samples hold, from the first sample (cheap: a header).
  virtual SampleLayout layout() const = 0;
  virtual void set_check(SampleCheck check) { check_ = std::move(check); }
  // Checks what can be checked of every sample without loading it (a file's
  // header: its tensors and shapes) against the SampleCheck, so that a bad
  // sample is named before the first step, not when an epoch reaches it.
  virtual void check_headers() const {}

 protected:
  SampleCheck check_;
};

struct DatasetSplits {
  std::shared_ptr<Dataset> train, val;
};

class SyntheticDataset : public Dataset {
 public:
  SyntheticDataset(SyntheticOptions options, int64_t first_index, size_t count);
  size_t size() const override { return count_; }
  Sample get(size_t index) const override;
  std::string describe() const override;
  SampleLayout layout() const override;

 private:
  SyntheticOptions options_;
  int64_t first_;
  size_t count_;
  mutable std::mutex mutex_;
  mutable std::map<size_t, Sample> cache_;
};

class DirectoryDataset : public Dataset {
 public:
  DirectoryDataset(std::string dir, std::vector<std::string> files);
  size_t size() const override { return files_.size(); }
  Sample get(size_t index) const override;
  Sample get(size_t index, const PointRequest& request) const override;
  std::string describe() const override;
  SampleLayout layout() const override;
  void check_headers() const override;

 private:
  std::string dir_;
  std::vector<std::string> files_;
  mutable std::atomic<bool> noted_old_format_{false};
};

// Several datasets as one (the recipe's extra_datasets): indices run through
// the parts in order; the check and the header checks apply to every part.
class ConcatDataset : public Dataset {
 public:
  explicit ConcatDataset(std::vector<std::shared_ptr<Dataset>> parts);
  size_t size() const override;
  Sample get(size_t index) const override;
  Sample get(size_t index, const PointRequest& request) const override;
  std::string describe() const override;
  SampleLayout layout() const override;
  void check_headers() const override;
  void set_check(SampleCheck check) override;

 private:
  std::pair<const Dataset*, size_t> locate(size_t index) const;
  std::vector<std::shared_ptr<Dataset>> parts_;
};

// Checks a sample's layout against `check`, naming `path`.
void check_layout(const SampleLayout& have, const SampleCheck& check, const std::string& path);

// Writes `num_train` + `num_val` synthetic samples and the manifest to `dir`.
void write_synthetic_directory(const std::string& dir, const SyntheticOptions& options,
                               int64_t num_train, int64_t num_val);

}  // namespace slipstream::aero
