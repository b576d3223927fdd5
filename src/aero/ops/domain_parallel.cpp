#include "aero/ops/domain_parallel.h"

#include "aero/ops/saved_address.h"

#include <torch/autograd.h>
#include <torch/torch.h>

namespace slipstream::aero {

namespace {

struct DomainSum : public torch::autograd::Function<DomainSum> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               int64_t group) {
    ctx->saved_data["group"] = group;
    auto sum = x.contiguous().clone();
    object_at<Communicator>(group)->all_reduce_sum(sum);
    return sum;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto sum = grads[0].contiguous().clone();
    object_at<Communicator>(ctx->saved_data["group"].toInt())->all_reduce_sum(sum);
    return {sum, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor domain_sum(const torch::Tensor& x, Communicator* group) {
  if (group == nullptr || group->world_size() == 1) return x;
  if (!torch::GradMode::is_enabled() || !x.requires_grad()) {
    auto sum = x.contiguous().clone();
    group->all_reduce_sum(sum);
    return sum;
  }
  return DomainSum::apply(x, address_of(group));
}

PointShard point_shard(int64_t n, int rank, int size) {
  TORCH_CHECK(size > 0 && rank >= 0 && rank < size, "domain: rank ", rank, " of ", size);
  const int64_t base = n / size, extra = n % size;
  PointShard s;
  s.count = base + (rank < extra ? 1 : 0);
  s.begin = rank * base + std::min<int64_t>(rank, extra);
  return s;
}

}  // namespace slipstream::aero
