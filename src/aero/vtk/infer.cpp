#include "aero/vtk/infer.h"

#include "aero/config/config.h"
#include "aero/data/loader.h"
#include "aero/device/device.h"
#include "aero/train/checkpoint.h"
#include "aero/train/train_settings.h"
#include "aero/vtk/raw_runs.h"
#include "aero/vtk/vtk_io.h"
#include "core/io/safetensors.h"

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>

namespace slipstream::aero {

namespace fs = std::filesystem;

InferReport run_inference(const InferOptions& o) {
  TORCH_CHECK(fs::exists(o.checkpoint), "infer: checkpoint '", o.checkpoint, "' does not exist");
  const fs::path ckpt = fs::absolute(o.checkpoint);
  const fs::path ckpt_dir = fs::is_directory(ckpt) ? ckpt : ckpt.parent_path();
  const std::string config_path = (ckpt_dir.parent_path() / "resolved_config.yaml").string();
  TORCH_CHECK(fs::is_regular_file(config_path), "infer: no resolved_config.yaml beside '",
              o.checkpoint, "' (looked for '", config_path, "')");
  const Config config = Config::load_resolved(config_path);
  const TrainSettings settings = resolve_settings(config);
  const c10::Device device = resolve_device(o.device, 0);

  Transolver model(settings.model);
  auto info = load_newest_checkpoint(ckpt.string(), &model, nullptr);
  TORCH_CHECK(info.has_value(), "infer: no complete checkpoint in '", o.checkpoint, "'");
  model->to(device);
  model->eval();

  std::map<std::string, std::string> fields = o.fields.empty() ? default_field_names() : o.fields;
  const Sample sample = read_raw_run(o.run_dir, fields);
  LoaderOptions lo = loader_options_for(settings, device);
  lo.sampling_resolution = 0;  // every point, transforms applied
  lo.volume_weights = false;
  const Batch full = make_host_batch(sample, lo, settings.seed);
  const int64_t n = sample.num_points();
  const int64_t chunk = std::max<int64_t>(1, settings.sampling_resolution);
  auto gen = at::detail::createCPUGenerator(settings.seed + 17);
  const auto order = torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kLong));
  auto prediction = torch::empty({n, full.target.size(-1)}, torch::kFloat);
  {
    torch::NoGradGuard no_grad;
    for (int64_t begin = 0; begin < n; begin += chunk) {
      const auto idx = order.narrow(0, begin, std::min(chunk, n - begin));
      auto emb = full.embedding.index_select(1, idx).to(device);
      auto fx = full.fx.index_select(1, idx).to(device);
      torch::Tensor out;
      {
        AutocastGuard autocast(device, device.is_cuda());
        out = model->forward(emb, fx);
      }
      prediction.index_copy_(0, idx, out.squeeze(0).to(torch::kFloat).cpu());
    }
  }
  const auto physical = denormalize_targets(prediction, sample, lo);
  std::vector<std::pair<std::string, torch::Tensor>> out_fields;
  InferReport report;
  report.points = n;
  nlohmann::json metrics;
  int64_t c0 = 0;
  for (const auto& name : settings.targets) {
    const int64_t c = name == "velocity" ? 3 : 1;
    const auto pred = physical.narrow(1, c0, c);
    const auto truth = sample.targets.at(name);
    const auto err = pred - truth;
    out_fields.emplace_back(name + "_pred", pred);
    out_fields.emplace_back(name + "_true", truth);
    out_fields.emplace_back(name + "_error", err);
    const double l2 = (err.norm() / truth.norm().clamp_min(1e-30)).item<double>();
    const double mae = err.abs().mean().item<double>();
    report.metrics[name + "_l2"] = l2;
    report.metrics[name + "_mae"] = mae;
    metrics[name + "_l2"] = l2;
    metrics[name + "_mae"] = mae;
    c0 += c;
  }
  write_vtu(o.out, sample.points, out_fields);
  fs::path json_path = o.out;
  json_path.replace_extension(".json");
  nlohmann::json doc{{"run", o.run_dir},        {"checkpoint", info->path},
                     {"epoch", info->epoch},    {"points", n},
                     {"metrics", metrics}};
  write_file_atomically(json_path.string(), doc.dump(2) + "\n");
  report.metrics_path = json_path.string();
  return report;
}

}  // namespace slipstream::aero
