#include "aero/train/graphed_step.h"

#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

namespace slipstream::aero {

namespace {

// What a graph depends on of a batch: its tensors' names, dtypes, shapes
// and devices, and which of them are one tensor (a model may test that, as
// GeoTransolver does for its geometry and its local positions, and search
// once for both).
std::string signature_of(const Batch& b) {
  std::ostringstream out;
  std::map<const void*, std::string> first_name;
  const auto describe = [&](const std::string& name, const torch::Tensor& t) {
    out << name << ':';
    if (t.defined()) {
      const auto [it, fresh] = first_name.emplace(t.unsafeGetTensorImpl(), name);
      if (fresh) {
        out << t.scalar_type() << t.sizes() << t.device();
      } else {
        out << "=" << it->second;
      }
    }
    out << ';';
  };
  for (const auto& [name, t] : b.inputs) describe(name, t);
  for (const auto& [name, t] : b.others()) describe(name, *t);
  return out.str();
}

// The batch's tensors by name, in one order for batches of one signature.
std::vector<std::pair<std::string, torch::Tensor>> tensors_of(const Batch& b) {
  std::vector<std::pair<std::string, torch::Tensor>> out(b.inputs.begin(), b.inputs.end());
  for (const auto& [name, t] : b.others()) out.emplace_back(name, *t);
  return out;
}

}  // namespace

bool use_cuda_graph(CudaGraphMode mode, c10::Device device, int world_size) {
  if (mode == CudaGraphMode::kOff) return false;
  const bool possible = CudaGraph::supported(device) && world_size == 1;
  if (mode == CudaGraphMode::kOn) {
    TORCH_CHECK(CudaGraph::supported(device), "config: training.cuda_graph=true needs a CUDA ",
                "device and a CUDA build; this run is on ", device.str(), " (use auto or false)");
    TORCH_CHECK(world_size == 1, "config: training.cuda_graph=true needs one process; this run ",
                "has ", world_size,
                " (the gradient all-reduce is not captured; use auto or false)");
  }
  return possible;
}

GraphedStep::GraphedStep(c10::Device device, int64_t max_captures)
    : device_(device), max_captures_(max_captures) {
  TORCH_CHECK(max_captures >= 1, "GraphedStep: max_captures must be at least 1, got ",
              max_captures);
}

LossResult GraphedStep::run(const Batch& batch, const Body& body) {
  if (gave_up_) return body(batch);
  const std::string signature = signature_of(batch);
  if (!graph_.captured() || signature != signature_) {
    graph_.reset();
    result_ = LossResult{};
    buffers_ = Batch{};
    if (captures_ >= max_captures_) {
      gave_up_ = true;
      signature_.clear();
      return body(batch);
    }
    // A buffer for each distinct tensor: inputs that are one tensor stay one.
    std::map<const void*, torch::Tensor> copies;
    const auto buffer_of = [&](const torch::Tensor& t) {
      if (!t.defined()) return t;
      auto& c = copies[t.unsafeGetTensorImpl()];
      if (!c.defined()) c = t.clone();
      return c;
    };
    buffers_.sample_index = batch.sample_index;
    for (const auto& [name, t] : batch.inputs) buffers_.inputs.emplace(name, buffer_of(t));
    const auto from = batch.others();
    auto to = buffers_.others();
    for (size_t i = 0; i < from.size(); ++i) *to[i].second = buffer_of(*from[i].second);
    graph_.capture(device_, [&] {
      result_ = body(buffers_);
      result_.total = result_.total.detach();
    });
    signature_ = signature;
    ++captures_;
  } else {
    // Each distinct buffer once (the signature says the aliasing is the same).
    const auto from = tensors_of(batch), to = tensors_of(buffers_);
    std::set<const void*> copied;
    for (size_t i = 0; i < from.size(); ++i) {
      auto dst = to[i].second;
      if (dst.defined() && copied.insert(dst.unsafeGetTensorImpl()).second) {
        dst.copy_(from[i].second, /*non_blocking=*/true);
      }
    }
  }
  graph_.replay();
  return result_;
}

LossResult run_graphed_step(std::optional<GraphedStep>& graphed, bool& given_up, CudaGraphMode mode,
                            int64_t step, const Batch& batch, const GraphedStep::Body& body) {
  if (!graphed) return body(batch);
  try {
    LossResult result = graphed->run(batch, body);
    if (graphed->gave_up() && !given_up) {
      given_up = true;
      TORCH_CHECK(mode != CudaGraphMode::kOn, "train: step ", step,
                  ": training.cuda_graph=true, but the batches changed shape after ",
                  graphed->captures(), " graph captures (use auto, or a ",
                  "dataset.sampling_resolution below every sample's point count)");
      std::fprintf(stderr,
                   "train: step %lld: the batches changed shape after %lld CUDA graph "
                   "captures; steps run eagerly from here (a dataset.sampling_resolution "
                   "below every sample's point count keeps one shape)\n",
                   static_cast<long long>(step), static_cast<long long>(graphed->captures()));
    }
    return result;
  } catch (const std::exception& e) {
    if (mode == CudaGraphMode::kOn) throw;
    std::fprintf(stderr,
                 "train: step %lld: CUDA graph capture failed, steps run eagerly from "
                 "here on (training.cuda_graph=false skips the attempt): %s\n",
                 static_cast<long long>(step), e.what());
    graphed.reset();
    given_up = true;
    return body(batch);
  }
}

}  // namespace slipstream::aero
