// PrefetchLoader: while the device runs step i, background threads
// (num_workers of them) prepare the next samples — each loads one, subsamples `sampling_resolution`
// points, applies the transforms, builds the model's inputs (by the InputSpec) and targets (by the
// FieldSchema), pins them (CUDA) and copies them to the device on a side stream; at most `prefetch`
// samples are ahead of the training thread. next() returns them in order and makes the current
// stream wait for the copy (an event wait on the device, not on the host) and tells the allocator
// the tensors are used on the current stream. A worker exception is rethrown by next() on the
// training thread, in order.
//
// Batch layout (batch size 1): inputs by name, each (1, N, C) or (1, 1, C)
// as the InputSpec builds them; target (1, N, C) = the schema's fields in
// channel order, in the model's space (non-dimensional, normalised);
// weights (1, N) = the cell volumes or areas when asked for, else undefined;
// force_weights (1, N, C, K) with loss.forces (force_loss.h), else undefined.
#pragma once

#include "aero/data/dataset.h"
#include "aero/data/input_spec.h"
#include "aero/data/transforms.h"
#include "aero/fields/field_schema.h"
#include "aero/forces/force_loss.h"

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <torch/types.h>

#include <array>
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace slipstream::aero {

struct LoaderOptions {
  int64_t sampling_resolution = 4096;  // points per step; all if the sample has fewer
  c10::Device device = c10::Device(c10::kCPU);
  uint64_t seed = 0;
  int prefetch = 2;  // samples prepared ahead
  // Threads preparing samples, each its own; batches still come in order.
  // <= 0: auto (resolved_workers).
  int num_workers = 0;
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
  // loss.forces: each batch carries the weights that map its prediction's
  // error to coefficient errors (force_loss.h). Unset: none.
  std::optional<ForceLossFrame> force_loss;
};

struct Batch {
  std::map<std::string, torch::Tensor> inputs;
  torch::Tensor target, weights;
  torch::Tensor force_weights;  // (1, N, C, K) with loss.forces, else undefined
  size_t sample_index = 0;
  std::string sample_id;

  // The per-point tensors besides the inputs, by name, some undefined: the
  // one list the device copy, the stream bookkeeping, the domain shard and
  // the CUDA graph's buffers walk, so that a tensor added here reaches all.
  std::array<std::pair<const char*, torch::Tensor*>, 3> others() {
    return {{{"<target>", &target}, {"<weights>", &weights}, {"<force_weights>", &force_weights}}};
  }
  std::array<std::pair<const char*, const torch::Tensor*>, 3> others() const {
    return {{{"<target>", &target}, {"<weights>", &weights}, {"<force_weights>", &force_weights}}};
  }
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

// The workers a loader uses: `requested` when positive, else 1 on the CPU
// (a worker would take cores from the step) and 3 on a GPU.
int resolved_workers(int requested, const c10::Device& device);

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
  Item prepare(size_t position, const std::optional<c10::Stream>& side) const;

  std::shared_ptr<const Dataset> dataset_;
  std::vector<size_t> order_;
  LoaderOptions options_;
  int64_t epoch_;
  size_t consumed_ = 0;  // positions handed out by next()
  size_t claimed_ = 0;   // positions taken by a worker
  size_t ahead_ = 1;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<size_t, Item> ready_;  // by position in order_
  bool stop_ = false, failed_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace slipstream::aero
