// Model: what the trainer, bench and inference need of a surrogate model,
// whatever its family. A model reads named inputs (built by the loader from
// the model config's `inputs:` spec) and returns (B, N, out_dim), the target
// fields in the schema's channel order. Its parameters carry PhysicsNeMo's
// state-dict names, so load_named() takes PhysicsNeMo weights unchanged.
// A new family is a new Model subclass and one entry in registry.cpp.
#pragma once

#include "aero/config/config.h"
#include "aero/ops/recompute.h"
#include "core/distributed/communicator.h"

#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace slipstream::aero {

using ModelInputs = std::map<std::string, torch::Tensor>;

// The widths a model is built for: per input (from the input spec and the
// dataset's samples) and its output (the target fields' channels).
struct ModelShape {
  std::map<std::string, int64_t> input_widths;  // per model input
  int64_t out_dim = 0;                          // total target channels
};

class Model : public torch::nn::Module {
 public:
  // The inputs forward() reads; the config's spec must name exactly these.
  virtual std::vector<std::string> input_names() const = 0;
  virtual torch::Tensor forward(const ModelInputs& inputs) = 0;
  // PhysicsNeMo's class name, e.g. "Transolver" (logged as the recipe does).
  virtual std::string class_name() const = 0;
  // Where PhysicsNeMo defines the class, and the constructor arguments that
  // build this model there (a .mdlus's args.json: `__module__`, `__args__`).
  virtual std::string physicsnemo_module() const = 0;
  virtual nlohmann::json physicsnemo_args() const = 0;
  // Which code paths the model's numerics take on `device` (bf16 autocast
  // or not), for the logs: e.g. {"physics_attention": "fused CUDA kernels"}.
  virtual nlohmann::json numerics(c10::Device device, bool bf16) const { return {}; }

  // Copies tensors by state-dict name (`prefix` is prepended to each name
  // looked up); every parameter must be present with its shape, else a
  // c10::Error names it.
  // Whether forward_in_chunks gives forward's result (to round-off) for
  // any chunk size: a model whose every point sees every other only through
  // sums can take two passes per layer (the sums over all chunks, then each
  // chunk's output), so a sample of any size goes through in bounded memory.
  virtual bool exact_in_chunks() const { return false; }
  // forward(inputs) in chunks of `chunk` points (no grad; every per-point
  // input (B, N, .) whole, on the model's device). Only where
  // exact_in_chunks().
  virtual torch::Tensor forward_in_chunks(const ModelInputs& inputs, int64_t chunk);

  // What the blocks keep for the backward (recompute.h); a model without
  // recompute accepts only Recompute::kNone and names itself otherwise.
  virtual void set_recompute(const RecomputeOptions& options);

  // Domain parallelism (domain_parallel.h): each rank of `group` holds a
  // shard of every sample's points; null: the whole sample here. A model
  // that cannot shard a sample accepts only null and names itself otherwise.
  virtual void set_domain_group(Communicator* group);
  // The per-point inputs every rank of a domain group holds whole rather
  // than its shard of (a neighbour search among all points reads them).
  virtual std::vector<std::string> whole_point_inputs() const { return {}; }

  void load_named(const std::map<std::string, torch::Tensor>& tensors,
                  const std::string& prefix = "");
  int64_t parameter_count() const;

 protected:
  // The input named `name`; throws naming the model and the input.
  const torch::Tensor& input(const ModelInputs& inputs, const std::string& name) const;
};

using ModelPtr = std::shared_ptr<Model>;

// What the logs and the bench JSON call "numerics": the code paths `model`
// takes on `device` (Model::numerics) and `config`'s numerics block.
nlohmann::json numerics_record(const Model& model, c10::Device device, bool bf16,
                               const Config& config);

}  // namespace slipstream::aero
