#include "aero/data/loader.h"

#include "aero/ops/domain_parallel.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

namespace slipstream::aero {

std::vector<size_t> epoch_order(size_t n, int64_t epoch, uint64_t seed, bool shuffle, int rank,
                                int world_size, bool drop_last) {
  TORCH_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "sampler: bad rank ", rank, " of ",
              world_size);
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
  const auto& t = o.transforms;
  auto gen = at::detail::createCPUGenerator(generator_seed);
  const torch::Tensor idx = subsample_indices(n, o.sampling_resolution, t.subsample, gen);
  auto take = [&](const torch::Tensor& x) { return idx.defined() ? x.index_select(0, idx) : x; };
  // The point fields this batch reads: the inputs', the targets and the weights.
  const SampleLayout needed = o.inputs.required(layout_of(s));
  std::map<std::string, torch::Tensor> point, global = s.global_data;
  point["points"] = take(s.point("points"));
  for (const auto& [name, c] : needed.point_channels) point[name] = take(s.point(name));
  for (const auto& f : o.fields.fields()) point[f.name] = take(s.point(f.name));
  if (!o.weight_field.empty()) {
    TORCH_CHECK(s.has_point(o.weight_field), "loader: loss weighting by '", o.weight_field,
                "' needs that field in sample ", s.id);
    point[o.weight_field] = take(s.point(o.weight_field));
  }
  if (t.center) {
    // The mean of all the sample's points, also when it holds a block of them.
    const auto mean = s.points_mean.defined() ? s.points_mean.to(torch::kFloat).view({1, 3})
                                              : s.point("points").mean(0, true);
    point["points"] = point["points"] - mean;
  }
  if (t.scale_by_L_ref) {
    const double l_ref = s.global_scalar("L_ref", std::nan(""));
    TORCH_CHECK(std::isfinite(l_ref) && l_ref > 0, "loader: sample ", s.id,
                " needs a positive global 'L_ref' to scale its lengths by (", l_ref, ")");
    point["points"] = point["points"] / l_ref;
    if (point.count("sdf")) point["sdf"] = point["sdf"] / l_ref;
  }
  if (o.force_loss) {
    TORCH_CHECK(s.has_point("normals") && s.has_point("area"),
                "loader: loss.forces needs a "
                "surface sample (normals and area per cell); sample ",
                s.id, " has neither");
    if (!point.count("normals")) point["normals"] = take(s.point("normals"));
    if (!point.count("area")) point["area"] = take(s.point("area"));
  }
  if (o.augment) augment(point, global, t, o.fields, gen);
  const FreeStream free_stream = s.free_stream();
  std::vector<torch::Tensor> targets;
  for (const auto& f : o.fields.fields()) {
    targets.push_back(o.fields.to_model(f, point.at(f.name), free_stream));
  }
  Batch b;
  b.sample_id = s.id;
  b.inputs = o.inputs.assemble(point, global);
  b.target = torch::cat(targets, 1).unsqueeze(0).contiguous();
  if (!o.weight_field.empty()) {
    b.weights = point.at(o.weight_field).reshape({-1}).unsqueeze(0).contiguous();
  }
  if (o.force_loss) {
    // A block read from a file (rows defined) does not say how many cells the
    // whole surface has, so its integrals cannot be scaled to the whole.
    TORCH_CHECK(!s.rows.defined(), "loader: loss.forces: sample '", s.id,
                "' was read as a block of its rows; set dataset.sampling_resolution to at least "
                "its cell count (every cell a step) to train on its forces");
    const double a_ref = o.force_loss->reference_area.value_or(s.global_scalar("A_ref", 0.0));
    TORCH_CHECK(a_ref > 0, "loader: loss.forces: sample '", s.id,
                "' has no A_ref global; set force_coefficients.reference_area");
    TORCH_CHECK(global.count("U_inf"), "loader: loss.forces: sample '", s.id, "' has no U_inf");
    const auto u = global.at("U_inf").to(torch::kDouble).reshape({3});
    const Vec3 flow{u[0].item<double>(), u[1].item<double>(), u[2].item<double>()};
    const int64_t kept = point.at("area").size(0);
    b.force_weights =
        force_loss_weights(point.at("normals"), point.at("area"), o.fields, free_stream, flow,
                           a_ref, static_cast<double>(n) / static_cast<double>(kept), *o.force_loss)
            .unsqueeze(0)
            .contiguous();
  }
  if (o.domain_size > 1) {
    // This rank's shard of every per-point tensor (B, N, .); a global
    // input (1, 1, C) and the whole_inputs stay whole, and inputs that share
    // one stay shared.
    const int64_t n_points = b.target.size(1);
    const auto shard = point_shard(n_points, o.domain_rank, o.domain_size);
    auto narrow = [&](const torch::Tensor& t) {
      return t.narrow(1, shard.begin, shard.count).contiguous();
    };
    std::map<const void*, torch::Tensor> sharded;
    for (auto& [name, t] : b.inputs) {
      if (t.size(1) != n_points || o.whole_inputs.count(name)) continue;
      auto& c = sharded[t.unsafeGetTensorImpl()];
      if (!c.defined()) c = narrow(t);
      t = c;
    }
    for (auto [name, t] : b.others()) {
      if (t->defined()) *t = narrow(*t);
    }
  }
  return b;
}

torch::Tensor denormalize_targets(const torch::Tensor& prediction, const Sample& s,
                                  const FieldSchema& fields) {
  TORCH_CHECK(prediction.dim() == 2 && prediction.size(1) == fields.total_channels(),
              "loader: a prediction of shape ", prediction.sizes(), " for ",
              fields.total_channels(), " target channels");
  const FreeStream free_stream = s.free_stream();
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < fields.size(); ++i) {
    const auto& f = fields.fields()[i];
    out.push_back(
        fields.to_physical(f, prediction.narrow(1, fields.offset(i), f.channels()), free_stream));
  }
  return torch::cat(out, 1);
}

int resolved_workers(int requested, const c10::Device& device) {
  if (requested > 0) return requested;
  return device.is_cuda() ? 3 : 1;
}

PrefetchLoader::PrefetchLoader(std::shared_ptr<const Dataset> dataset, std::vector<size_t> order,
                               LoaderOptions options, int64_t epoch)
    : dataset_(std::move(dataset)),
      order_(std::move(order)),
      options_(std::move(options)),
      epoch_(epoch) {
  TORCH_CHECK(options_.prefetch >= 1, "loader: prefetch must be >= 1");
  const int workers = resolved_workers(options_.num_workers, options_.device);
  ahead_ = static_cast<size_t>(std::max(options_.prefetch, workers));
  for (int w = 0; w < workers; ++w) workers_.emplace_back([this] { run(); });
}

PrefetchLoader::~PrefetchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) {
    if (w.joinable()) w.join();
  }
}

PrefetchLoader::Item PrefetchLoader::prepare(size_t position,
                                             const std::optional<c10::Stream>& side) const {
  const c10::Device device = options_.device;
  Item item;
  try {
    const size_t index = order_[position];
    const uint64_t seed =
        options_.seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch_) * 1000003ULL + index;
    PointRequest request{options_.sampling_resolution, options_.transforms.subsample, seed};
    request.sample_seed = options_.seed * 0x9E3779B97F4A7C15ULL + index;
    request.epoch = epoch_;
    const Sample sample = dataset_->get(index, request);
    Batch host = make_host_batch(sample, options_, seed);
    host.sample_index = index;
    if (side) {
      c10::StreamGuard guard(*side);
      auto to_device = [&](const torch::Tensor& t) {
        return t.defined() ? t.pin_memory().to(device, /*non_blocking=*/true) : t;
      };
      // One copy per host tensor: inputs that share one stay shared.
      std::map<const void*, torch::Tensor> copied;
      for (const auto& [name, t] : host.inputs) {
        auto& d = copied[t.unsafeGetTensorImpl()];
        if (!d.defined()) d = to_device(t);
        item.batch.inputs[name] = d;
      }
      const auto from = host.others();
      auto to = item.batch.others();
      for (size_t i = 0; i < from.size(); ++i) *to[i].second = to_device(*from[i].second);
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
  return item;
}

void PrefetchLoader::run() {
  const c10::Device device = options_.device;
  std::optional<c10::Stream> side;
  std::exception_ptr setup_error;
  try {
    if (device.is_cuda()) {
      const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
      impl->setDevice(device);
      side = impl->getStreamFromGlobalPool(device, /*isHighPriority=*/false);
    }
  } catch (...) {
    setup_error = std::current_exception();
  }
  while (true) {
    size_t position = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // At most max(prefetch, workers) positions ahead of the training thread.
      cv_.wait(lock, [&] {
        return stop_ || failed_ || claimed_ >= order_.size() || claimed_ < consumed_ + ahead_;
      });
      if (stop_ || failed_ || claimed_ >= order_.size()) return;
      position = claimed_++;
    }
    Item item;
    if (setup_error) {
      item.error = setup_error;
    } else {
      item = prepare(position, side);
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (item.error) failed_ = true;  // no new positions; next() rethrows in order
      ready_.emplace(position, std::move(item));
    }
    cv_.notify_all();
  }
}

Batch PrefetchLoader::next() {
  TORCH_CHECK(has_next(), "loader: no batches left in this epoch");
  Item item;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // Every claimed position arrives, a failed one too (and a failure stops
    // new claims), so the next one in order always comes.
    cv_.wait(lock, [&] { return ready_.count(consumed_) > 0; });
    auto it = ready_.find(consumed_);
    item = std::move(it->second);
    ready_.erase(it);
    ++consumed_;
  }
  cv_.notify_all();
  if (item.error) std::rethrow_exception(item.error);
  if (item.ready) {
    const auto* impl = c10::impl::getDeviceGuardImpl(options_.device.type());
    const c10::Stream current = impl->getStream(options_.device);
    item.ready->block(current);  // the device waits, the host does not
    std::set<const void*> recorded;
    for (auto& [name, t] : item.batch.inputs) {
      if (recorded.insert(t.unsafeGetTensorImpl()).second) t.record_stream(current);
    }
    // Each tensor is used on `current` from here: without this its memory
    // could go back to the loader's stream, and be overwritten by the next
    // sample's copy, while this step's kernels still read it.
    for (auto [name, t] : item.batch.others()) {
      if (t->defined()) t->record_stream(current);
    }
  }
  return std::move(item.batch);
}

}  // namespace slipstream::aero
