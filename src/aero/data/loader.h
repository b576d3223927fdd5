// PrefetchLoader: while the device runs step i, a background thread prepares
// sample i+1 — loads it, subsamples `sampling_resolution` points, applies the
// transforms, builds the model's inputs (by the InputSpec) and targets (by
// the FieldSchema), pins them (CUDA) and copies them to the device on a side
// stream. next() makes the current stream wait for that copy (an
// event wait on the device, not on the host) and tells the allocator the
// tensors are used on the current stream. A worker exception is rethrown by
// next() on the training thread, in order.
//
// Batch layout (batch size 1): inputs by name, each (1, N, C) or (1, 1, C)
// as the InputSpec builds them; target (1, N, C) = the schema's fields in
// channel order, in the model's space (non-dimensional, normalised);
// weights (1, N) = the cell volumes or areas when asked for, else undefined.
#pragma once

#include "aero/data/dataset.h"
#include "aero/data/input_spec.h"
#include "aero/data/transforms.h"
#include "aero/fields/field_schema.h"

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <torch/types.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace slipstream::aero {

struct LoaderOptions {
  int64_t sampling_resolution = 4096;  // points per step; all if the sample has fewer
  c10::Device device = c10::Device(c10::kCPU);
  uint64_t seed = 0;
  int prefetch = 2;  // samples prepared ahead
  FieldSchema fields = default_volume_fields();
  InputSpec inputs;
  std::string weight_field;  // "volume" or "area" to weight the loss by it; empty: none
  TransformOptions transforms;
  bool augment = false;  // random rotation/translation (train only)
  // Domain parallelism: keep shard domain_rank of domain_size of the step's
  // points (after the subsample and the transforms, which every rank of the
  // group draws alike: their seed is the sample's, not the rank's).
  int domain_rank = 0, domain_size = 1;
  // Inputs every rank keeps whole under domain parallelism
  // (Model::whole_point_inputs: a neighbour search among all points).
  std::set<std::string> whole_inputs;
};

struct Batch {
  std::map<std::string, torch::Tensor> inputs;
  torch::Tensor target, weights;
  size_t sample_index = 0;
  std::string sample_id;
};

// The sample order of an epoch for one rank: a permutation of [0, n) drawn
// from (seed, epoch) when `shuffle`, then every world_size-th entry from
// `rank`. With drop_last each rank gets floor(n / world) samples; without,
// ceil(n / world), padding by wrapping around. Same length on every rank.
std::vector<size_t> epoch_order(size_t n, int64_t epoch, uint64_t seed, bool shuffle, int rank,
                                int world_size, bool drop_last);

// Builds a batch on the host from a sample: subsample (with
// `generator_seed`), then the transforms, then this rank's shard of the
// points. sampling_resolution <= 0 keeps every point in order.
Batch make_host_batch(const Sample& sample, const LoaderOptions& options, uint64_t generator_seed);

// Undoes the target transforms on a (N, C) prediction in the schema's
// channel order: the same layout in physical units.
torch::Tensor denormalize_targets(const torch::Tensor& prediction, const Sample& sample,
                                  const FieldSchema& fields);

class PrefetchLoader {
 public:
  PrefetchLoader(std::shared_ptr<const Dataset> dataset, std::vector<size_t> order,
                 LoaderOptions options, int64_t epoch);
  ~PrefetchLoader();
  PrefetchLoader(const PrefetchLoader&) = delete;
  PrefetchLoader& operator=(const PrefetchLoader&) = delete;

  size_t size() const { return order_.size(); }
  bool has_next() const { return consumed_ < order_.size(); }
  // The next batch, on the device; rethrows the worker's exception.
  Batch next();

 private:
  struct Item {
    Batch batch;
    std::optional<c10::Event> ready;
    std::exception_ptr error;
  };
  void run();

  std::shared_ptr<const Dataset> dataset_;
  std::vector<size_t> order_;
  LoaderOptions options_;
  int64_t epoch_;
  size_t consumed_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace slipstream::aero
