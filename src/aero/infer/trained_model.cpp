#include "aero/infer/trained_model.h"

#include "aero/data/loader.h"
#include "aero/interop/mdlus.h"
#include "aero/model/registry.h"
#include "aero/ops/domain_parallel.h"
#include "aero/ops/fp8_linear.h"
#include "aero/ops/numerics_settings.h"
#include "core/device/device.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>

namespace slipstream::aero {

namespace fs = std::filesystem;

TrainedModel trained_from_mdlus(const std::string& path, const Config& config,
                                const SampleLayout& layout, c10::Device device) {
  const auto file = read_mdlus(path);
  TrainedModel t;
  t.spec = resolve_run_spec(config);
  const NumericsSettings numerics = numerics_settings(config);
  t.fields = t.spec.fields;
  // An fp8-trained model also runs where fp8 cannot (inference_precision).
  const std::string& trained_in = t.spec.settings.precision;
  t.trained_precision =
      trained_in == "fp8" ? Precision::kFp8 : decide_precision(trained_in, device);
  t.device = device;
  t.precision = inference_precision(t.trained_precision, device);
  apply_numerics(numerics, t.precision == Precision::kFp8);
  t.domain = sample_domain(t.spec.settings);
  t.model = build_model(config, model_shape(t.spec, layout));
  load_mdlus_weights(*t.model, file);
  t.checkpoint.path = path;
  t.model->to(device);
  t.model->eval();
  return t;
}

TrainedCheckpoint read_trained(const std::string& checkpoint) {
  TORCH_CHECK(fs::exists(checkpoint), "checkpoint: '", checkpoint, "' does not exist");
  fs::path ckpt = fs::absolute(checkpoint);
  // A run directory stands for its checkpoints/ (the newest complete one).
  if (fs::is_directory(ckpt) && fs::is_directory(ckpt / "checkpoints")) ckpt /= "checkpoints";
  const fs::path ckpt_dir = fs::is_directory(ckpt) ? ckpt : ckpt.parent_path();
  auto file = read_newest_checkpoint(ckpt.string());
  TORCH_CHECK(file.has_value(), "checkpoint: no complete checkpoint in '", checkpoint, "'");
  const auto& meta = file->info.metadata;
  // The checkpoint's own copy of its run's config, which no later run can
  // rewrite; the resolved_config.yaml beside it for checkpoints without one.
  const std::string config_path = (ckpt_dir.parent_path() / "resolved_config.yaml").string();
  TORCH_CHECK(meta.count("config") || fs::is_regular_file(config_path), "checkpoint: '",
              file->info.path,
              "' holds no config and there is no resolved_config.yaml "
              "beside it (looked for '",
              config_path, "')");
  Config config = meta.count("config")
                      ? Config::parse_resolved(meta.at("config"), "'" + file->info.path + "'")
                      : Config::load_resolved(config_path);
  return {std::move(*file), std::move(config)};
}

TrainedModel load_trained(const TrainedCheckpoint& trained, c10::Device device) {
  const auto& info = trained.file.info;
  const auto& meta = info.metadata;
  auto need = [&](const char* key) -> const std::string& {
    auto it = meta.find(key);
    TORCH_CHECK(it != meta.end(), "checkpoint: '", info.path, "' does not record '", key,
                "' (written by an older Slipstream; retrain or resume it once to rewrite it)");
    return it->second;
  };
  TrainedModel t;
  t.spec = resolve_run_spec(trained.config);
  const NumericsSettings numerics = numerics_settings(trained.config);
  t.fields = FieldSchema::from_json(nlohmann::json::parse(need("fields")));
  t.trained_precision = parse_precision(need("precision"));
  t.device = device;
  t.precision = inference_precision(t.trained_precision, device);
  apply_numerics(numerics, t.precision == Precision::kFp8);
  t.domain = sample_domain(t.spec.settings);
  const auto shape_json = nlohmann::json::parse(need("model_shape"));
  ModelShape shape;
  shape.input_widths = shape_json.at("input_widths").get<std::map<std::string, int64_t>>();
  shape.out_dim = shape_json.at("out_dim").get<int64_t>();
  t.model = build_model(trained.config, shape);
  apply_checkpoint(trained.file, t.model.get(), nullptr);
  t.checkpoint = info;
  if (auto it = meta.find("envelope"); it != meta.end()) {
    t.envelope = SampleEnvelope::from_json(nlohmann::json::parse(it->second));
  }
  t.model->to(device);
  t.model->eval();
  return t;
}

TrainedModel load_trained(const std::string& checkpoint, c10::Device device) {
  return load_trained(read_trained(checkpoint), device);
}

torch::Tensor TrainedModel::predict(const Sample& sample, int64_t chunk) const {
  TORCH_CHECK(chunk > 0, "infer: chunk must be > 0");
  LoaderOptions lo = loader_options(spec, device);
  lo.fields = fields;
  lo.sampling_resolution = 0;  // every point, transforms applied
  lo.weight_field.clear();
  lo.force_loss.reset();
  Communicator* group =
      domain_group != nullptr && domain_group->world_size() > 1 ? domain_group : nullptr;
  TORCH_CHECK(group == nullptr || model->exact_in_chunks(), "infer: ", model->class_name(),
              " cannot split a sample's points over ranks (it is not exact in chunks)");
  PointShard shard{0, sample.num_points()};
  if (group != nullptr) {  // this rank's shard of the points
    lo.domain_rank = group->rank();
    lo.domain_size = group->world_size();
    for (const auto& name : model->whole_point_inputs()) lo.whole_inputs.insert(name);
    shard = point_shard(sample.num_points(), group->rank(), group->world_size());
  }
  const Batch full = make_host_batch(sample, lo, spec.settings.seed);
  const int64_t n = sample.num_points();
  if (model->exact_in_chunks()) {  // every point at once, in bounded memory
    torch::NoGradGuard no_grad;
    ModelInputs inputs;
    std::map<const void*, torch::Tensor> on_device;  // shared inputs stay shared
    for (const auto& [name, t] : full.inputs) {
      auto& d = on_device[t.unsafeGetTensorImpl()];
      if (!d.defined()) d = t.to(device);
      inputs[name] = d;
    }
    torch::Tensor out;
    model->set_domain_group(group);
    try {
      AutocastGuard autocast(device, bf16_autocast(precision));
      if (precision == Precision::kFp8) fp8::update_scales();  // the amaxes seen so far
      out = model->forward_in_chunks(inputs, chunk);
    } catch (...) {
      model->set_domain_group(nullptr);
      throw;
    }
    model->set_domain_group(nullptr);
    out = out.squeeze(0).to(torch::kFloat);
    if (group != nullptr) {  // every rank's shard into one (N, C), on every rank
      auto whole = torch::zeros({n, out.size(1)}, out.options());
      whole.narrow(0, shard.begin, shard.count).copy_(out);
      group->all_reduce_sum(whole);
      out = whole;
    }
    return denormalize_targets(out.cpu(), sample, fields);
  }
  auto gen = at::detail::createCPUGenerator(spec.settings.seed + 17);
  const auto order = torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kLong));
  auto prediction = torch::empty({n, fields.total_channels()}, torch::kFloat);
  torch::NoGradGuard no_grad;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const auto idx = order.narrow(0, begin, std::min(chunk, n - begin));
    ModelInputs inputs;
    std::map<const void*, torch::Tensor> chunked;  // shared inputs stay shared
    for (const auto& [name, t] : full.inputs) {
      auto& c = chunked[t.unsafeGetTensorImpl()];
      // Per-point inputs are chunked; a global input (1, 1, C) goes whole.
      if (!c.defined()) c = (t.size(1) == n ? t.index_select(1, idx) : t).to(device);
      inputs[name] = c;
    }
    torch::Tensor out;
    {
      AutocastGuard autocast(device, bf16_autocast(precision));
      if (precision == Precision::kFp8) fp8::update_scales();  // the amaxes seen so far
      out = model->forward(inputs);
    }
    prediction.index_copy_(0, idx, out.squeeze(0).to(torch::kFloat).cpu());
  }
  return denormalize_targets(prediction, sample, fields);
}

}  // namespace slipstream::aero
