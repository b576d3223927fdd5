// GradientAverager: averages gradients over ranks with bucketed all-reduces
// that overlap the backward pass (what DDP's reducer does, by hand).
//
// Parameters are grouped, in reverse registration order (roughly the order
// backward produces their gradients), into buckets of about `bucket_bytes`.
// A hook on each parameter copies its gradient into its bucket's flat buffer
// as soon as autograd computes it; when a bucket is full, and every bucket
// before it has been launched, its all-reduce starts asynchronously, while
// backward goes on. finish() launches what is left (a parameter with no
// gradient this step counts as zeros), waits (on CUDA: the current stream
// waits, the host does not), divides by the world size and writes each
// parameter's .grad. Every rank must run the same graph, so collectives are
// issued in the same order everywhere.
//
// Usage per step: prepare(); loss.backward(); finish(); optimizer.step().
#pragma once

#include "core/distributed/communicator.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace slipstream {

class GradientAverager {
 public:
  GradientAverager(std::vector<at::Tensor> parameters, Communicator* comm,
                   int64_t bucket_bytes = 25 * 1024 * 1024);
  ~GradientAverager();
  GradientAverager(const GradientAverager&) = delete;
  GradientAverager& operator=(const GradientAverager&) = delete;

  void prepare();
  void finish();
  size_t bucket_count() const { return buckets_.size(); }
  // Buckets whose all-reduce started during backward in the last step.
  size_t launched_during_backward() const { return launched_in_backward_; }

 private:
  struct Slot {
    size_t bucket;
    int64_t offset, numel;
    bool ready = false;
  };
  struct Bucket {
    at::Tensor flat;
    std::vector<size_t> params;
    size_t remaining = 0;
    std::unique_ptr<PendingCollective> pending;
  };
  void on_gradient(size_t index, const at::Tensor& grad);
  void launch_ready_buckets();

  std::vector<at::Tensor> params_;
  Communicator* comm_;
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  std::vector<unsigned> hook_ids_;
  size_t next_launch_ = 0;
  size_t launched_in_backward_ = 0;
  bool in_backward_ = false;
};

}  // namespace slipstream
