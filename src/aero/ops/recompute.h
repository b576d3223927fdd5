// Activation recompute (checkpointing) for the models' blocks.
//
// recompute(fn, x) returns fn(x) without keeping any tensor fn makes: the
// forward runs without grad and keeps x alone; the backward runs fn(x)
// again, with grad and under the autocast state of the forward, and
// backpropagates the incoming gradient through that graph (a reentrant
// backward: fn's parameters get their gradients accumulated as the
// undisturbed backward would, and x its gradient). fn must be deterministic
// (no dropout), read no other tensor that needs grad than x and parameters,
// and outlive the backward.
//
// With `point_chunk` > 0, fn is taken to be pointwise along dim 1 (an MLP,
// a LayerNorm: row n of the output depends on row n of x only), and both
// passes go `point_chunk` points at a time, so that fn's own activations
// never exist for more than one chunk: the peak of a pointwise sub-block
// falls from N rows to a chunk's. The parameter gradients are then sums over
// chunks (equal to the unchunked ones to fp32 round-off); without chunks
// they are bitwise the same on the CPU.
#pragma once

#include <torch/types.h>

#include <string>

namespace slipstream::aero {

// What the model's blocks keep for the backward (training.recompute):
//   none       everything (fastest, the most memory)
//   attention  each block's attention sub-block is recomputed
//   block      each whole block is recomputed from its input, its two
//              sub-blocks in turn (the pointwise one in chunks of points)
enum class Recompute { kNone, kAttention, kBlock };
Recompute parse_recompute(const std::string& name);  // throws naming the value
std::string to_string(Recompute mode);

struct RecomputeOptions {
  Recompute mode = Recompute::kNone;
  int64_t point_chunk = 0;  // pointwise sub-blocks in chunks of this many points; 0: whole
};

class Recomputable {
 public:
  virtual ~Recomputable() = default;
  virtual torch::Tensor run(const torch::Tensor& x) = 0;
  // A sub-block that reads one more tensor than x, one that may need grad
  // (GALE's context, which every block reads): recompute(fn, x, chunk, side)
  // calls this, in both passes, and returns side's gradient too.
  virtual torch::Tensor run_with(const torch::Tensor& x, const torch::Tensor& side) {
    (void)side;
    return run(x);
  }
};

// With `side` defined, fn.run_with(x, side) instead of fn.run(x); side is
// then kept for the backward as x is (it is not copied: keep it small, or
// kept anyway), and point_chunk must be 0.
torch::Tensor recompute(Recomputable& fn, const torch::Tensor& x, int64_t point_chunk = 0,
                        const torch::Tensor& side = {});

// second(first(x)) kept as recompute(second, recompute(first, x)) would keep
// it (x alone), but with one recompute of each instead of two: the backward
// runs first(x) with grad, then second (pointwise) in chunks of
// `point_chunk` points from first's output, forward and backward a chunk at
// a time, then backpropagates through first. `side`, when defined, is read
// by first alone (first.run_with(x, side)).
torch::Tensor recompute_pair(Recomputable& first, Recomputable& second, const torch::Tensor& x,
                             int64_t point_chunk, const torch::Tensor& side = {});

}  // namespace slipstream::aero
