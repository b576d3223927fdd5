#include "aero/data/loader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
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

torch::Tensor rotate_z(const torch::Tensor& xyz, double radians) {
  const double c = std::cos(radians), s = std::sin(radians);
  auto r = torch::tensor({c, -s, 0.0, s, c, 0.0, 0.0, 0.0, 1.0}, xyz.options().dtype(torch::kDouble))
               .view({3, 3})
               .to(xyz.scalar_type());
  return torch::matmul(xyz, r.t());
}

namespace {
int64_t channels_of(const std::string& name) { return name == "velocity" ? 3 : 1; }

double dynamic_pressure(const Sample& s) {
  const double speed2 = s.u_inf.to(torch::kDouble).pow(2).sum().item<double>();
  return 0.5 * s.rho_inf * speed2;
}
}  // namespace

Batch make_host_batch(const Sample& s, const LoaderOptions& o, uint64_t generator_seed) {
  const int64_t n = s.num_points();
  const auto& t = o.transforms;
  auto gen = at::detail::createCPUGenerator(generator_seed);
  torch::Tensor idx;
  if (o.sampling_resolution > 0 && o.sampling_resolution < n) {
    if (t.subsample == "block") {
      const int64_t start =
          torch::randint(n - o.sampling_resolution + 1, {1}, gen, torch::kLong).item<int64_t>();
      idx = torch::arange(start, start + o.sampling_resolution, torch::kLong);
    } else {
      idx = torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kLong))
                .narrow(0, 0, o.sampling_resolution);
    }
  }
  auto take = [&](const torch::Tensor& x) { return idx.defined() ? x.index_select(0, idx) : x; };
  auto points = take(s.points);
  auto normals = take(s.sdf_normals);
  auto u_inf = s.u_inf.reshape({1, 3});
  if (t.center) points = points - s.points.mean(0, true);
  std::vector<torch::Tensor> targets;
  for (const auto& name : o.target_names) {
    auto y = take(s.targets.at(name));
    if (t.nondimensionalize && name == "velocity") y = y / s.u_inf.norm();
    if (t.nondimensionalize && name == "pressure") y = (y - s.p_inf) / dynamic_pressure(s);
    if (name == "nut") y = (y - t.nut_mean) / t.nut_std;
    targets.push_back(y);
  }
  if (o.augment && (t.rotate_z_max_deg > 0 || t.translate_max > 0)) {
    auto draw = torch::empty({4}, torch::kDouble).uniform_(-1.0, 1.0, gen);
    const double angle = draw[0].item<double>() * t.rotate_z_max_deg * M_PI / 180.0;
    if (t.rotate_z_max_deg > 0) {
      points = rotate_z(points, angle);
      normals = rotate_z(normals, angle);
      u_inf = rotate_z(u_inf, angle);
      for (size_t k = 0; k < o.target_names.size(); ++k) {
        if (o.target_names[k] == "velocity") targets[k] = rotate_z(targets[k], angle);
      }
    }
    if (t.translate_max > 0) {
      points = points + (draw.narrow(0, 1, 3) * t.translate_max).to(points.scalar_type()).view({1, 3});
    }
  }
  Batch b;
  b.sample_id = s.id;
  b.embedding = torch::cat({points, take(s.sdf), normals}, 1).unsqueeze(0).contiguous();
  const int64_t m = b.embedding.size(1);
  b.fx = u_inf.reshape({1, 1, 3}).expand({1, m, 3}).contiguous();
  b.target = torch::cat(targets, 1).unsqueeze(0).contiguous();
  if (o.volume_weights) {
    TORCH_CHECK(s.volume.defined(), "loader: loss weighting by volume needs 'volume' in sample ",
                s.id);
    b.weights = take(s.volume.reshape({-1})).unsqueeze(0).contiguous();
  }
  return b;
}

torch::Tensor denormalize_targets(const torch::Tensor& prediction, const Sample& s,
                                  const LoaderOptions& o) {
  const auto& t = o.transforms;
  std::vector<torch::Tensor> out;
  int64_t c0 = 0;
  for (const auto& name : o.target_names) {
    const int64_t c = channels_of(name);
    auto y = prediction.narrow(-1, c0, c);
    if (t.nondimensionalize && name == "velocity") y = y * s.u_inf.norm();
    if (t.nondimensionalize && name == "pressure") y = y * dynamic_pressure(s) + s.p_inf;
    if (name == "nut") y = y * t.nut_std + t.nut_mean;
    out.push_back(y);
    c0 += c;
  }
  return torch::cat(out, -1);
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
