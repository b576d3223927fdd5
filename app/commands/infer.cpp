// slipstream infer --checkpoint CKPT --in RUN --out OUT.vtu [--device D]:
// a trained model over every point of a raw run, written back as a .vtu for
// ParaView with, per target field, <name>_pred, <name>_true and
// <name>_error (pred - true), in physical units (the dataset's transforms
// undone), plus OUT.json with the metrics. The model runs in the precision
// its checkpoint records (fp32 on a CPU). Points go through the model in
// chunks of the training resolution, in a fixed random order, so each chunk
// sees the whole body as training did.
#include "aero/train/run.h"
#include "commands/commands.h"
#include "commands/field_names.h"
#include "core/device/device.h"
#include "core/io/atomic_file.h"

#ifdef SLIPSTREAM_WITH_VTK
#include "aero/vtk/raw_runs.h"
#include "aero/vtk/vtk_io.h"
#endif

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <memory>

namespace slipstream::app {

namespace {

struct InferOptions {
  std::string checkpoint, run_dir, out, device = "auto";
  FieldNameOptions fields;
};

#ifdef SLIPSTREAM_WITH_VTK
int run_infer(const InferOptions& o) {
  const c10::Device device = resolve_device(o.device, 0);
  const aero::TrainedModel trained = aero::load_trained(o.checkpoint, device);
  const aero::Sample sample = aero::read_raw_run(o.run_dir, trained.fields, o.fields.resolve());
  const int64_t chunk = std::max<int64_t>(1, trained.spec.settings.sampling_resolution);
  const auto physical = trained.predict(sample, chunk);
  std::vector<std::pair<std::string, torch::Tensor>> out_fields;
  nlohmann::json metrics = nlohmann::json::object();
  const auto& fields = trained.fields;
  for (size_t i = 0; i < fields.size(); ++i) {
    const auto& f = fields.fields()[i];
    const auto pred = physical.narrow(1, fields.offset(i), f.channels());
    const auto& truth = sample.point(f.name);
    const auto err = pred - truth;
    out_fields.emplace_back(f.name + "_pred", pred);
    out_fields.emplace_back(f.name + "_true", truth);
    out_fields.emplace_back(f.name + "_error", err);
    metrics[f.name + "_l2"] = (err.norm() / truth.norm().clamp_min(1e-30)).item<double>();
    metrics[f.name + "_mae"] = err.abs().mean().item<double>();
  }
  aero::write_vtu(o.out, sample.point("points"), out_fields);
  std::filesystem::path json_path = o.out;
  json_path.replace_extension(".json");
  const nlohmann::json doc{{"run", o.run_dir},
                           {"checkpoint", trained.checkpoint.path},
                           {"epoch", trained.checkpoint.position.epochs_done},
                           {"points", sample.num_points()},
                           {"precision", aero::to_string(trained.precision)},
                           {"trained_precision", aero::to_string(trained.trained_precision)},
                           {"metrics", metrics}};
  write_file_atomically(json_path.string(), doc.dump(2) + "\n");
  std::cout << "Wrote " << o.out << " (" << sample.num_points() << " points, "
            << aero::to_string(trained.precision) << " on " << device.str() << "); metrics in "
            << json_path.string() << ":";
  for (const auto& [k, v] : metrics.items()) std::cout << " " << k << "=" << v.get<double>();
  std::cout << "\n";
  return 0;
}
#endif

}  // namespace

Command add_infer(CLI::App& app, const CommandContext& context) {
  auto o = std::make_shared<InferOptions>();
  auto* sub = app.add_subcommand("infer", "predict every point of a raw run into a .vtu");
  sub->add_option("--checkpoint", o->checkpoint, "checkpoint file or checkpoints/ directory")
      ->required();
  sub->add_option("--in", o->run_dir, "a raw run directory (.vtu, .stl, metadata.json)")
      ->required();
  sub->add_option("--out", o->out, "output .vtu (metrics go beside it as .json)")->required();
  sub->add_option("--device", o->device, "auto, cpu or cuda");
  o->fields.add_to(sub);
  return {sub, [o]() -> int {
#ifdef SLIPSTREAM_WITH_VTK
            return run_infer(*o);
#else
            needs_vtk("infer");
#endif
          }};
}

}  // namespace slipstream::app
