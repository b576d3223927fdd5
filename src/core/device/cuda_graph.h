// CudaGraph: a piece of a step's device work recorded once as a CUDA graph
// and replayed, so that its ~thousands of kernels go to the GPU as one
// launch instead of one at a time from the host.
//
// capture() runs `body` under stream capture on the current stream, which
// must not be the default one (SideStreamGuard below): the host code runs
// (autograd, allocations, kernel launches), but the GPU runs nothing.
// replay() then runs what was recorded on the current stream, on the same
// memory: the tensors `body` read must still be the ones it read (copy new
// inputs into them), and what it wrote is overwritten in place by each
// replay. Memory allocated inside `body` comes from the graph's own pool
// and stays valid while the graph lives. `body` must have run once before
// outside a capture, on this stream (cuBLAS creates its handles then, and
// autograd's gradient accumulators take the stream they are made on).
//
// The capture mode is thread-local: other host threads (the loader, the
// readback) may keep using CUDA while a capture is under way. No host sync
// anywhere. Everything compiles on a CPU-only LibTorch; there, supported()
// is false and capture() throws.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

#include <functional>
#include <memory>

namespace slipstream {

class CudaGraph {
 public:
  CudaGraph();
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Whether graphs can be captured on `device` (a CUDA build and device).
  static bool supported(c10::Device device);

  // The stream for a graph's work on `device` (CUDA builds): one per device
  // for the process, created for this purpose and never one of PyTorch's
  // pooled streams. The pool hands its 32 streams out round-robin, so a
  // pooled stream comes back to the next caller after 32 requests: a loader
  // worker's copies would then run on the stream being captured, and be
  // recorded into the graph.
  static c10::Stream side_stream(c10::Device device);

  // Records `body`'s work on `device` (dropping any earlier graph). When a
  // graph (this one's or another's) was dropped since the last capture, its
  // pool is first given back to the device with the caching allocator's
  // other unused blocks (a device sync, once a capture). Throws
  // what `body` or the capture throws (an op that syncs or copies from
  // pageable memory cannot be captured); the graph is then empty.
  void capture(c10::Device device, const std::function<void()>& body);
  // Runs the recorded work on the current stream. Throws if none.
  void replay();
  bool captured() const;
  // Drops the graph (and, once its tensors are gone, its memory).
  void reset();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Makes `stream` current on its device while alive. It starts after the
// work already queued on the stream it replaces, and that stream's later
// work starts after `stream`'s: tensors may cross the two either way.
class SideStreamGuard {
 public:
  explicit SideStreamGuard(c10::Stream stream);
  ~SideStreamGuard();
  SideStreamGuard(const SideStreamGuard&) = delete;
  SideStreamGuard& operator=(const SideStreamGuard&) = delete;

 private:
  c10::Stream previous_, stream_;
  c10::StreamGuard guard_;
};

}  // namespace slipstream
