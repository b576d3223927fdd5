#include "core/device/cuda_graph.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#ifdef SLIPSTREAM_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <atomic>
#include <map>
#include <mutex>

namespace slipstream {

namespace {
// Set when a captured graph is dropped. Its memory pool may then be given
// back, but the caching allocator gives such pools back only when an
// allocation made outside a capture finds the device full: a new capture
// would put its own pool on top (reserved memory grew by a whole step's
// activations at each epoch's capture until a capture ran out of memory).
std::atomic<bool> dropped_graph_pools{false};
}  // namespace

struct CudaGraph::Impl {
#ifdef SLIPSTREAM_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
};

CudaGraph::CudaGraph() : impl_(std::make_unique<Impl>()) {}

CudaGraph::~CudaGraph() { reset(); }

bool CudaGraph::supported(c10::Device device) {
#ifdef SLIPSTREAM_WITH_CUDA
  return device.is_cuda();
#else
  (void)device;
  return false;
#endif
}

c10::Stream CudaGraph::side_stream(c10::Device device) {
  TORCH_CHECK(supported(device), "CUDA graphs: not available on ", device.str(),
              " (they need a CUDA build and a CUDA device)");
#ifdef SLIPSTREAM_WITH_CUDA
  static std::mutex mutex;
  static std::map<c10::DeviceIndex, cudaStream_t> streams;  // live until the process ends
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  std::lock_guard<std::mutex> lock(mutex);
  cudaStream_t& stream = streams[index];
  if (stream == nullptr) {
    c10::cuda::CUDAGuard guard(index);
    C10_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  return c10::cuda::getStreamFromExternal(stream, index);
#else
  return c10::Stream(c10::Stream::DEFAULT, device);
#endif
}

void CudaGraph::capture(c10::Device device, const std::function<void()>& body) {
  TORCH_CHECK(supported(device), "CUDA graphs: not available on ", device.str(),
              " (they need a CUDA build and a CUDA device)");
#ifdef SLIPSTREAM_WITH_CUDA
  reset();
  const c10::cuda::CUDAGuard device_guard(device);
  if (dropped_graph_pools.exchange(false)) c10::cuda::CUDACachingAllocator::emptyCache();
  TORCH_CHECK(c10::cuda::getCurrentCUDAStream(device.index()) !=
                  c10::cuda::getDefaultCUDAStream(device.index()),
              "CUDA graphs: capture on a side stream (SideStreamGuard), not the default one");
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
  try {
    body();
  } catch (...) {
    // End the capture so that the stream is usable again; the partial
    // graph is dropped.
    try {
      graph->capture_end();
    } catch (...) {
    }
    dropped_graph_pools = true;
    throw;
  }
  graph->capture_end();
  impl_->graph = std::move(graph);
#else
  (void)body;
#endif
}

void CudaGraph::replay() {
  TORCH_CHECK(captured(), "CUDA graphs: replay() before a capture");
#ifdef SLIPSTREAM_WITH_CUDA
  impl_->graph->replay();
#endif
}

bool CudaGraph::captured() const {
#ifdef SLIPSTREAM_WITH_CUDA
  return impl_->graph != nullptr;
#else
  return false;
#endif
}

void CudaGraph::reset() {
#ifdef SLIPSTREAM_WITH_CUDA
  if (impl_->graph) {
    impl_->graph.reset();
    dropped_graph_pools = true;
  }
#endif
}

namespace {
c10::Stream current_stream_of(c10::Stream stream) {
  return c10::impl::getDeviceGuardImpl(stream.device_type())->getStream(stream.device());
}
void join(c10::Stream waiter, c10::Stream on) {
  c10::Event event(on.device_type());
  event.record(on);
  event.block(waiter);
}
}  // namespace

SideStreamGuard::SideStreamGuard(c10::Stream stream)
    : previous_(current_stream_of(stream)), stream_(stream), guard_(stream) {
  join(stream_, previous_);
}

SideStreamGuard::~SideStreamGuard() { join(previous_, stream_); }

}  // namespace slipstream
