// Communicator: the few collectives the core needs, over any c10d backend.
//
// The readback and the trainer talk to this interface, not to a c10d process
// group, so that the same code runs single-process (no communicator), on Gloo
// (CPU) or NCCL (CUDA), and across LibTorch versions whose c10d class
// hierarchies differ.
//
// Stream semantics follow c10d's: on CUDA, all_reduce_sum enqueues the
// collective after the work already on the current stream and makes the
// current stream wait for it; it does not block the host. On CPU (Gloo) it
// returns once the sum is in place.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <memory>
#include <string>
#include <vector>

namespace slipstream {

// A collective in flight. wait(): on CUDA the current stream waits for it
// (the host does not); on CPU the host waits until the result is in place.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend_name() const = 0;

  // In-place sum over all ranks.
  virtual void all_reduce_sum(at::Tensor& tensor) = 0;
  // Starts an in-place sum and returns at once; wait() before reading.
  virtual std::unique_ptr<PendingCollective> all_reduce_sum_async(at::Tensor& tensor) = 0;
  // In-place max over all ranks.
  virtual void all_reduce_max(at::Tensor& tensor) = 0;
  // In-place broadcast from `root`.
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  // Every rank waits here until all have arrived.
  virtual void barrier() = 0;

  // After this rank failed with `what` (its own error, or a collective that
  // failed because of a peer): posts `what` for the other ranks, then names
  // the ranks that failed or stopped responding (no heartbeat) first,
  // waiting a few seconds for a dead rank's heartbeat to go stale. Empty
  // when nothing is known of the others. Never throws.
  virtual std::string diagnose_failure(const std::string& what) { return {}; }

  // A communicator over `ranks` (ranks of this one, increasing, this rank
  // among them), in which this rank is its index there. Every rank of the
  // subgroup must call it, with the same list; the others do not. A
  // communicator that cannot make one says so.
  virtual std::unique_ptr<Communicator> subgroup(const std::vector<int>& ranks) {
    TORCH_CHECK(false, "distributed: the ", backend_name(), " communicator cannot make subgroups");
    return nullptr;  // not reached
  }
};

}  // namespace slipstream
