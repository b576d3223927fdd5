// GraphedStep: a train step's forward, loss and backward as one CUDA graph
// (training.cuda_graph), so that the step's few thousand kernels reach the
// GPU without a gap between each pair of them.
//
// run() is called with each step's batch and the step's body (forward,
// loss, zero_grad, backward). The first call, and any call whose batch has
// other shapes, dtypes or aliasing than the captured one, copies the batch into
// buffers of its own and captures the body reading them; every call then
// copies the batch into those buffers and replays. The body's host code
// runs only at a capture: it must do the same device work for every batch
// of those shapes (no host-side branching on values; nothing here syncs
// anyway), and the parameters' gradients it leaves are the graph's memory,
// rewritten by each replay, so nothing may drop them between replays
// (zero_grad belongs inside the body). The optimizer step stays outside.
// As for CudaGraph::capture, the current stream must be a side stream
// (SideStreamGuard) on which the body has run once eagerly: the trainer runs
// a graphed epoch on one from its first step, which is eager.
//
// Batches whose shapes keep changing (a surface's every cell, one sample a
// step, each sample its own cell count) would be captured at nearly every
// step: a capture costs more than the eager step it replaces, and each one
// holds a graph's memory. After `max_captures` captures a batch of yet
// another signature gives the graph up: that call and every later one run
// the body eagerly, the graph and its buffers are released, and gave_up()
// says so.
#pragma once

#include "aero/data/loader.h"
#include "aero/loss/loss_calculator.h"
#include "aero/run/train_settings.h"
#include "core/device/cuda_graph.h"

#include <c10/core/Device.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace slipstream::aero {

// Whether a run on `device` with `world_size` processes captures its steps;
// throws for kOn where that is not possible, saying why.
bool use_cuda_graph(CudaGraphMode mode, c10::Device device, int world_size);

class GraphedStep {
 public:
  using Body = std::function<LossResult(const Batch&)>;
  static constexpr int64_t kDefaultMaxCaptures = 3;
  explicit GraphedStep(c10::Device device, int64_t max_captures = kDefaultMaxCaptures);

  // This step's losses: tensors the graph rewrites at every replay (read
  // them before the next run(), on the same stream, as the readback does).
  LossResult run(const Batch& batch, const Body& body);
  int64_t captures() const { return captures_; }
  bool gave_up() const { return gave_up_; }

 private:
  c10::Device device_;
  CudaGraph graph_;
  Batch buffers_;
  LossResult result_;
  std::string signature_;
  int64_t max_captures_;
  int64_t captures_ = 0;
  bool gave_up_ = false;
};

// One train step through `graphed` where it is set, else `body` eagerly.
// Where the graph gives up (batches of too many shapes) or its capture
// fails, the step runs eagerly, `graphed` is reset, `given_up` is set and
// one line on stderr says so; under training.cuda_graph=true (kOn) either
// is an error naming `step`.
LossResult run_graphed_step(std::optional<GraphedStep>& graphed, bool& given_up, CudaGraphMode mode,
                            int64_t step, const Batch& batch, const GraphedStep::Body& body);

}  // namespace slipstream::aero
