#include "core/distributed/gradient_averager.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace slipstream {

GradientAverager::GradientAverager(std::vector<at::Tensor> parameters, Communicator* comm,
                                   int64_t bucket_bytes)
    : params_(std::move(parameters)), comm_(comm) {
  TORCH_CHECK(comm_ != nullptr, "gradient averager: a communicator is required");
  slots_.resize(params_.size());
  // Reverse order: the last layers' gradients come first in backward.
  Bucket current;
  int64_t current_bytes = 0;
  std::vector<std::vector<size_t>> groups;
  std::vector<size_t> group;
  for (size_t k = params_.size(); k-- > 0;) {
    const auto& p = params_[k];
    if (!p.requires_grad()) continue;
    if (!group.empty() &&
        (current_bytes + static_cast<int64_t>(p.numel() * p.element_size()) > bucket_bytes ||
         p.scalar_type() != params_[group.front()].scalar_type() ||
         p.device() != params_[group.front()].device())) {
      groups.push_back(group);
      group.clear();
      current_bytes = 0;
    }
    group.push_back(k);
    current_bytes += static_cast<int64_t>(p.numel() * p.element_size());
  }
  if (!group.empty()) groups.push_back(group);
  for (auto& g : groups) {
    Bucket b;
    int64_t offset = 0;
    for (size_t k : g) {
      slots_[k] = Slot{buckets_.size(), offset, params_[k].numel(), false};
      offset += params_[k].numel();
    }
    b.flat = at::zeros({offset}, params_[g.front()].options().requires_grad(false));
    b.params = g;
    buckets_.push_back(std::move(b));
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!params_[k].requires_grad()) continue;
    hook_ids_.push_back(
        params_[k].register_hook([this, k](const at::Tensor& grad) { on_gradient(k, grad); }));
  }
}

GradientAverager::~GradientAverager() {
  size_t h = 0;
  for (size_t k = 0; k < params_.size() && h < hook_ids_.size(); ++k) {
    if (params_[k].requires_grad()) params_[k].remove_hook(hook_ids_[h++]);
  }
}

void GradientAverager::prepare() {
  for (auto& s : slots_) s.ready = false;
  for (auto& b : buckets_) {
    b.remaining = b.params.size();
    b.pending.reset();
  }
  next_launch_ = 0;
  launched_in_backward_ = 0;
  in_backward_ = true;
}

void GradientAverager::on_gradient(size_t index, const at::Tensor& grad) {
  Slot& s = slots_[index];
  TORCH_INTERNAL_ASSERT(!s.ready, "gradient averager: parameter ", index,
                        " got two gradients in one backward");
  Bucket& b = buckets_[s.bucket];
  b.flat.narrow(0, s.offset, s.numel).copy_(grad.reshape({-1}));
  s.ready = true;
  --b.remaining;
  launch_ready_buckets();
}

void GradientAverager::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].remaining == 0) {
    Bucket& b = buckets_[next_launch_++];
    b.pending = comm_->all_reduce_sum_async(b.flat);
    if (in_backward_) ++launched_in_backward_;
  }
}

void GradientAverager::finish() {
  in_backward_ = false;
  for (auto& b : buckets_) {
    for (size_t k : b.params) {
      Slot& s = slots_[k];
      if (!s.ready) {  // unused this step: contributes zeros
        b.flat.narrow(0, s.offset, s.numel).zero_();
        s.ready = true;
        --b.remaining;
      }
    }
  }
  launch_ready_buckets();
  const double world = static_cast<double>(comm_->world_size());
  for (auto& b : buckets_) {
    TORCH_INTERNAL_ASSERT(b.pending != nullptr);
    b.pending->wait();
    b.pending.reset();
    b.flat.div_(world);
    for (size_t k : b.params) {
      const Slot& s = slots_[k];
      auto& p = params_[k];
      auto averaged = b.flat.narrow(0, s.offset, s.numel).view_as(p);
      if (p.grad().defined()) {
        p.mutable_grad().copy_(averaged);
      } else {
        p.mutable_grad() = averaged.clone();
      }
    }
  }
}

}  // namespace slipstream
