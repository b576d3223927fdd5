#include "aero/model/model.h"

#include "aero/ops/numerics_settings.h"

#include <torch/torch.h>

namespace slipstream::aero {

void Model::set_recompute(const RecomputeOptions& options) {
  TORCH_CHECK(options.mode == Recompute::kNone, "model: ", class_name(),
              " does not support training.recompute=", to_string(options.mode),
              " yet; use training.recompute=none");
}

void Model::set_domain_group(Communicator* group) {
  TORCH_CHECK(group == nullptr || group->world_size() == 1, "model: ", class_name(),
              " cannot shard a sample's points over ranks (distributed.domain_parallel) yet");
}

void Model::load_named(const std::map<std::string, torch::Tensor>& tensors,
                       const std::string& prefix) {
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    auto it = tensors.find(prefix + p.key());
    TORCH_CHECK(it != tensors.end(), "model: no tensor '", prefix + p.key(), "' to load");
    TORCH_CHECK(it->second.sizes() == p.value().sizes(), "model: tensor '", prefix + p.key(),
                "' has shape ", it->second.sizes(), ", the model expects ", p.value().sizes());
    p.value().copy_(it->second);
  }
}

int64_t Model::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

const torch::Tensor& Model::input(const ModelInputs& inputs, const std::string& name) const {
  auto it = inputs.find(name);
  TORCH_CHECK(it != inputs.end(), "model: ", class_name(), " needs the input '", name, "'");
  return it->second;
}

torch::Tensor Model::forward_in_chunks(const ModelInputs& /*inputs*/, int64_t /*chunk*/) {
  TORCH_CHECK(false, "model: ", class_name(), " has no exact chunked forward");
}

nlohmann::json numerics_record(const Model& model, c10::Device device, bool bf16,
                               const Config& config) {
  nlohmann::json n = model.numerics(device, bf16);
  n.update(to_json(numerics_settings(config)));
  return n;
}

}  // namespace slipstream::aero
