#include "aero/data/loader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <random>

namespace slipstream::aero {

std::vector<size_t> epoch_order(size_t n, int64_t epoch, uint64_t seed, bool shuffle, int rank,
                                int world_size, bool drop_last) {
  TORCH_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "sampler: bad rank ", rank,
              " of ", world_size);
  std::vector<size_t> all(n);
  std::iota(all.begin(), all.end(), size_t{0});
  if (shuffle) {
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch));
    std::shuffle(all.begin(), all.end(), rng);
  }
  const size_t w = static_cast<size_t>(world_size);
  const size_t per_rank = drop_last ? n / w : (n + w - 1) / w;
  std::vector<size_t> mine;
  mine.reserve(per_rank);
  for (size_t i = 0; i < per_rank && n > 0; ++i) mine.push_back(all[(i * w + rank) % n]);
  return mine;
}

Batch make_host_batch(const Sample& s, const LoaderOptions& o, uint64_t generator_seed) {
  const int64_t n = s.num_points();
  torch::Tensor idx;
  if (o.sampling_resolution > 0 && o.sampling_resolution < n) {
    auto gen = at::detail::createCPUGenerator(generator_seed);
    idx = torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kLong))
              .narrow(0, 0, o.sampling_resolution);
  }
  auto take = [&](const torch::Tensor& t) { return idx.defined() ? t.index_select(0, idx) : t; };
  Batch b;
  b.sample_id = s.id;
  b.embedding = take(torch::cat({s.points, s.sdf, s.sdf_normals}, 1)).unsqueeze(0).contiguous();
  const int64_t m = b.embedding.size(1);
  b.fx = s.u_inf.reshape({1, 1, 3}).expand({1, m, 3}).contiguous();
  std::vector<torch::Tensor> targets;
  for (const auto& name : o.target_names) targets.push_back(s.targets.at(name));
  b.target = take(torch::cat(targets, 1)).unsqueeze(0).contiguous();
  if (o.volume_weights) {
    TORCH_CHECK(s.volume.defined(), "loader: loss weighting by volume needs 'volume' in sample ",
                s.id);
    b.weights = take(s.volume.reshape({-1})).unsqueeze(0).contiguous();
  }
  return b;
}

PrefetchLoader::PrefetchLoader(std::shared_ptr<const Dataset> dataset, std::vector<size_t> order,
                               LoaderOptions options, int64_t epoch)
    : dataset_(std::move(dataset)), order_(std::move(order)), options_(std::move(options)),
      epoch_(epoch) {
  TORCH_CHECK(options_.prefetch >= 1, "loader: prefetch must be >= 1");
  worker_ = std::thread([this] { run(); });
}

PrefetchLoader::~PrefetchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void PrefetchLoader::run() {
  const c10::Device device = options_.device;
  const bool cuda = device.is_cuda();
  std::optional<c10::Stream> side;
  try {
    if (cuda) {
      const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
      impl->setDevice(device);
      side = impl->getStreamFromGlobalPool(device, /*isHighPriority=*/false);
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(Item{{}, std::nullopt, std::current_exception()});
    cv_.notify_all();
    return;
  }
  for (size_t i = 0; i < order_.size(); ++i) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || queue_.size() < static_cast<size_t>(options_.prefetch); });
      if (stop_) return;
    }
    Item item;
    try {
      const size_t index = order_[i];
      const Sample sample = dataset_->get(index);
      const uint64_t seed = options_.seed * 0x9E3779B97F4A7C15ULL +
                            static_cast<uint64_t>(epoch_) * 1000003ULL + index;
      Batch host = make_host_batch(sample, options_, seed);
      host.sample_index = index;
      if (cuda) {
        c10::StreamGuard guard(*side);
        auto to_device = [&](const torch::Tensor& t) {
          return t.defined() ? t.pin_memory().to(device, /*non_blocking=*/true) : t;
        };
        item.batch.embedding = to_device(host.embedding);
        item.batch.fx = to_device(host.fx);
        item.batch.target = to_device(host.target);
        item.batch.weights = to_device(host.weights);
        item.batch.sample_index = host.sample_index;
        item.batch.sample_id = host.sample_id;
        c10::Event ready(device.type());
        ready.record(*side);
        item.ready.emplace(std::move(ready));
      } else {
        item.batch = std::move(host);
      }
    } catch (...) {
      item.error = std::current_exception();
    }
    const bool failed = item.error != nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(item));
    }
    cv_.notify_all();
    if (failed) return;
  }
}

Batch PrefetchLoader::next() {
  TORCH_CHECK(has_next(), "loader: no batches left in this epoch");
  Item item;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return !queue_.empty(); });
    item = std::move(queue_.front());
    queue_.pop_front();
  }
  cv_.notify_all();
  ++consumed_;
  if (item.error) std::rethrow_exception(item.error);
  if (item.ready) {
    const auto* impl = c10::impl::getDeviceGuardImpl(options_.device.type());
    const c10::Stream current = impl->getStream(options_.device);
    item.ready->block(current);  // the device waits, the host does not
    for (auto* t : {&item.batch.embedding, &item.batch.fx, &item.batch.target,
                    &item.batch.weights}) {
      if (t->defined()) t->record_stream(current);
    }
  }
  return std::move(item.batch);
}

}  // namespace slipstream::aero
