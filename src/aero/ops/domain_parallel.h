// Domain parallelism: one sample's points sharded over the ranks of a
// domain group (DESIGN.md §11, Transolver++'s scheme). Every layer's slice
// statistics are sums over all points, so each rank sums its shard's and
// domain_sum() adds them up across the group: every rank then holds the
// same slice tokens, and attention among the slices and the deslice stay
// local. Its backward sums the gradient across the group the same way, so
// that after the parameter gradients are summed over the group the step is
// the unsharded step on the whole sample (to round-off).
#pragma once

#include "core/distributed/communicator.h"

#include <torch/types.h>

namespace slipstream::aero {

// The sum of `x` over the ranks of `group` (x itself when null), forward
// and backward. Every rank must call it in the same order.
torch::Tensor domain_sum(const torch::Tensor& x, Communicator* group);

// Which of n points rank `rank` of `size` holds: [begin, begin + count),
// contiguous shards, the first n % size ranks one point more.
struct PointShard {
  int64_t begin = 0, count = 0;
};
PointShard point_shard(int64_t n, int rank, int size);

}  // namespace slipstream::aero
