// slipstream infer --checkpoint CKPT (--in RUN | --split NAME [--data DIR])
//                  --out PATH [--device D]
// slipstream eval --checkpoint CKPT [--split NAME] [--data DIR] [--out DIR]
// A trained model at full resolution — every point of a volume, every cell
// of a surface (one pass where it fits) — written back for ParaView with,
// per target field, <name>_pred, <name>_true and <name>_error (pred - true)
// in physical units, and for surfaces the force coefficients from the
// predicted and the true fields (aero/infer/inference.h).
//   --in RUN     a raw run (volume: .vtu + .stl; surface: .vtp) -> PATH
//                (.vtu or .vtp) and PATH's .json with metrics and forces
//   --split S    every sample of split S of the run's sample directory (or
//                --data DIR) -> PATH/: <sample>.vtp | .vtu, metrics.jsonl
//                (infer_step per sample, infer_summary, infer_forces_summary),
//                forces.svg (predicted vs true CD and CL with y = x and R²),
//                and a table on the console.
// `eval` is --split without the meshes: the same metrics, forces and
// table (and, with --out, metrics.jsonl and forces.svg), for a split whose
// meshes would be gigabytes. Metrics are in physical units, as labelled.
// The model runs in the precision its checkpoint records (fp32 on a CPU).
// A PhysicsNeMo .mdlus (--split only) takes the config it lacks from
// configs/ and key=value overrides, which must build the file's model.
// Under `slipstream launch --nproc D`, --split runs each sample's points
// split over the D ranks (exact: the same prediction as one process), and
// rank 0 writes.
#include "aero/infer/inference.h"
#include "aero/infer/trained_model.h"
#include "aero/interop/mdlus.h"
#include "aero/run/runtime.h"
#include "aero/run/train_settings.h"
#include "commands/commands.h"
#include "commands/field_names.h"
#include "commands/output_guard.h"
#include "commands/tables.h"
#include "core/distributed/launch_env.h"
#include "core/io/atomic_file.h"
#include "core/io/svg_scatter.h"
#include "core/sinks/jsonl_sink.h"

#include "aero/vtk/vtu_writer.h"

#ifdef SLIPSTREAM_WITH_VTK
#include "aero/vtk/raw_runs.h"
#include "aero/vtk/vtk_io.h"
#endif

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

namespace slipstream::app {

namespace fs = std::filesystem;

namespace {

struct InferOptions {
  std::string checkpoint, run_dir, split, data, out, device = "auto";
  bool write_meshes = true;            // false: `eval` (metrics and forces only)
  std::vector<std::string> overrides;  // with a .mdlus: the config it lacks
  FieldNameOptions fields;
};

// <name>_pred, <name>_true, <name>_error per target, physical units.
std::vector<std::pair<std::string, torch::Tensor>> output_fields(const aero::SampleInference& r,
                                                                 const aero::Sample& sample,
                                                                 const aero::FieldSchema& fields) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t i = 0; i < fields.size(); ++i) {
    const auto& f = fields.fields()[i];
    const auto pred = r.prediction.narrow(1, fields.offset(i), f.channels());
    const auto& truth = sample.point(f.name);
    out.emplace_back(f.name + "_pred", pred);
    out.emplace_back(f.name + "_true", truth);
    out.emplace_back(f.name + "_error", pred - truth);
  }
  return out;
}

// Writes the sample's ParaView file at `stem` + .vtp (a surface with its
// polygons: needs VTK) or .vtu (points); returns the path, or "" for a
// surface without VTK.
std::string write_paraview(const std::string& stem, const aero::SampleInference& r,
                           const aero::Sample& sample, const aero::TrainedModel& trained) {
  const auto out = output_fields(r, sample, trained.fields);
  if (trained.domain == aero::SampleDomain::kSurface && !sample.mesh.empty()) {
#ifdef SLIPSTREAM_WITH_VTK
    aero::SurfaceMesh mesh;
    mesh.vertices = sample.mesh.at("vertices");
    mesh.offsets = sample.mesh.at("offsets");
    mesh.connectivity = sample.mesh.at("connectivity");
    mesh.name = sample.id;
    auto cells = out;
    cells.emplace_back("normals", sample.point("normals"));
    aero::write_vtp(stem + ".vtp", mesh, cells);
    return stem + ".vtp";
#else
    return "";
#endif
  }
  aero::write_vtu(stem + ".vtu", sample.point("points"), out);
  return stem + ".vtu";
}

std::string file_stem(const std::string& id) {
  std::string stem = fs::path(id).stem().string();
  for (char& c : stem) {
    if (c == ':' || c == '/' || c == ' ') c = '_';
  }
  return stem.empty() ? "sample" : stem;
}

std::string r2_note(const aero::CoefficientSummary& c) {
  char r2[48], buf[128];
  if (std::isnan(c.r2)) {
    std::snprintf(r2, sizeof r2, "R\xc2\xb2 undefined (the truth does not vary)");
  } else {
    std::snprintf(r2, sizeof r2, "R\xc2\xb2 %.4f", c.r2);
  }
  std::snprintf(buf, sizeof buf, "%s   MAE %.4g   n %lld", r2, c.mae,
                static_cast<long long>(c.samples));
  return buf;
}

// A prediction outside what the model was trained on is marked, never silent.
void warn_out_of_distribution(const std::string& id, const aero::SampleInference& r) {
  if (r.out_of_range.empty()) return;
  std::cerr << "infer: warning: '" << id
            << "' lies outside the training data: " << aero::describe_out_of_range(r.out_of_range)
            << "; its prediction is an "
            << "extrapolation\n";
}

int run_split(const InferOptions& o, const aero::TrainedModel& trained, c10::Device device) {
  auto dataset = aero::open_named_split(trained.spec, o.split, o.data);
  TORCH_CHECK(dataset->size() > 0, "infer: split '", o.split, "' has no samples");
  // Over domain-parallel ranks every rank predicts every sample (its shard
  // of the points) and rank 0 alone writes.
  const bool writer = trained.domain_group == nullptr || trained.domain_group->rank() == 0;
  const int ranks = trained.domain_group == nullptr ? 1 : trained.domain_group->world_size();
  if (!writer) {
    for (size_t i = 0; i < dataset->size(); ++i) aero::infer_sample(trained, dataset->get(i));
    return 0;
  }
  // eval without --out writes nothing: the console has it all.
  std::optional<JsonlSink> jsonl;
  const std::string jsonl_path = o.out.empty() ? std::string() : o.out + "/metrics.jsonl";
  if (!o.out.empty()) {
    fs::create_directories(o.out);
    std::error_code ec;
    fs::remove(jsonl_path, ec);  // this inference's records only
    jsonl.emplace(jsonl_path);
  }
  const auto& position = trained.checkpoint.position;
  std::cout << "Checkpoint: " << trained.checkpoint.path << " (epoch " << position.epochs_done
            << ", step " << position.global_step << "), " << aero::to_string(trained.precision)
            << " on " << device.str() << "; split '" << o.split << "': " << dataset->size()
            << " samples\n";
  const nlohmann::json config{{"checkpoint", trained.checkpoint.path},
                              {"domain_parallel", ranks},
                              {"epoch", position.epochs_done},
                              {"global_step", position.global_step},
                              {"split", o.split},
                              {"dataset", dataset->describe()},
                              {"samples", dataset->size()},
                              {"meshes", o.write_meshes},
                              {"units", "physical"},
                              {"precision", aero::to_string(trained.precision)},
                              {"device", device.str()}};
  if (jsonl) jsonl->write_document("infer_config", config);
  std::vector<aero::SampleInference> results;
  bool wrote_files = false;
  for (size_t i = 0; i < dataset->size(); ++i) {
    const aero::Sample sample = dataset->get(i);
    aero::SampleInference r = aero::infer_sample(trained, sample);
    const std::string file =
        o.write_meshes ? write_paraview(o.out + "/" + file_stem(sample.id), r, sample, trained)
                       : std::string();
    wrote_files = wrote_files || !file.empty();
    nlohmann::json record = aero::infer_step_record(r, i);
    if (!file.empty()) record["file"] = file;
    if (jsonl) jsonl->write_document("infer_step", record);
    std::cout << "[" << i + 1 << "/" << dataset->size() << "] " << sample.id << ": " << r.points
              << " " << aero::point_noun(trained.domain) << " in " << r.seconds << " s ("
              << r.chunks << (r.chunks == 1 ? " pass" : " chunks")
              << (trained.model->exact_in_chunks() || r.chunks == 1 ? "" : ", approximate")
              << (ranks > 1 ? " over " + std::to_string(ranks) + " ranks" : "") << ", peak "
              << r.peak_memory_gib << " GiB)";
    if (!r.forces_pred.empty()) {
      std::cout << ", CD " << r.forces_pred.at("CD") << " (true " << r.forces_true.at("CD")
                << "), CL " << r.forces_pred.at("CL") << " (true " << r.forces_true.at("CL") << ")";
    }
    std::cout << "\n";
    warn_out_of_distribution(sample.id, r);
    r.prediction = torch::Tensor();  // keep the metrics, not the fields
    results.push_back(std::move(r));
  }
  const aero::SplitSummary summary = aero::summarize_split(results, o.split);
  if (jsonl) jsonl->write_document("infer_summary", summary.summary);
  std::cout << "Split '" << o.split << "': " << results.size() << " samples";
  if (trained.envelope.empty()) {
    std::cout << " (the checkpoint records no training envelope: nothing checked for "
                 "out-of-distribution);";
  } else {
    std::cout << " (" << summary.summary["out_of_distribution_samples"].get<int64_t>()
              << " outside the training data);";
  }
  std::cout << " metrics in physical units:";
  for (const auto& [k, v] : summary.summary["metrics"].items()) {
    std::cout << " " << k << "=" << v.get<double>();
  }
  std::cout << "\n";
  if (!summary.forces.is_null()) {
    if (jsonl) jsonl->write_document("infer_forces_summary", summary.forces);
    std::cout << format_forces_table(summary.coefficients);
  }
  if (!summary.forces.is_null() && !o.out.empty()) {
    std::vector<ScatterPanel> panels;
    for (const char* name : {"CD", "CL"}) {
      ScatterPanel p;
      p.title = std::string(name) + " over '" + o.split + "'";
      p.x_label = std::string("true ") + name + " (integrated from the CFD fields)";
      p.y_label = std::string("predicted ") + name;
      for (const auto& r : results) {
        p.x.push_back(r.forces_true.at(name));
        p.y.push_back(r.forces_pred.at(name));
      }
      p.note = r2_note(summary.coefficients.at(name));
      panels.push_back(std::move(p));
    }
    write_file_atomically(o.out + "/forces.svg", scatter_svg(panels));
    std::cout << "Forces plot: " << o.out << "/forces.svg\n";
  }
  if (o.write_meshes && !wrote_files) {
    std::cout << "note: this slipstream was built without VTK: no .vtp surface files written\n";
  }
  if (jsonl) {
    jsonl->flush();
    std::cout << "Records: " << jsonl_path << "\n";
  }
  return 0;
}

#ifdef SLIPSTREAM_WITH_VTK
int run_single(const InferOptions& o, const aero::TrainedModel& trained, c10::Device device) {
  const bool surface = trained.domain == aero::SampleDomain::kSurface;
  const aero::Sample sample =
      surface ? aero::read_raw_surface_run(o.run_dir, trained.fields, o.fields.resolve())
              : aero::read_raw_run(o.run_dir, trained.fields, o.fields.resolve());
  const aero::SampleInference r = aero::infer_sample(trained, sample);
  fs::path stem = o.out;
  stem.replace_extension("");
  const std::string file = write_paraview(stem.string(), r, sample, trained);
  nlohmann::json doc{{"run", o.run_dir},
                     {"file", file},
                     {"checkpoint", trained.checkpoint.path},
                     {"epoch", trained.checkpoint.position.epochs_done},
                     {"points", sample.num_points()},
                     {"seconds", r.seconds},
                     {"precision", aero::to_string(trained.precision)},
                     {"trained_precision", aero::to_string(trained.trained_precision)},
                     {"metrics", r.metrics}};
  const auto record = aero::infer_step_record(r, 0);
  if (!r.forces_pred.empty()) doc["forces"] = record["forces"];
  doc["in_distribution"] = record["in_distribution"];
  doc["out_of_distribution"] = record["out_of_distribution"];
  warn_out_of_distribution(o.run_dir, r);
  const std::string json_path = stem.string() + ".json";
  write_file_atomically(json_path, doc.dump(2) + "\n");
  std::cout << "Wrote " << file << " (" << sample.num_points() << " "
            << aero::point_noun(trained.domain) << ", " << aero::to_string(trained.precision)
            << " on " << device.str() << "); metrics in " << json_path << ":";
  for (const auto& [k, v] : r.metrics) std::cout << " " << k << "=" << v;
  for (const auto& [k, v] : r.forces_pred) {
    std::cout << " " << k << "=" << v << " (true " << r.forces_true.at(k) << ")";
  }
  std::cout << "\n";
  return 0;
}
#endif

// A PhysicsNeMo .mdlus records no fields, statistics or inputs: the config
// (configs/ plus the overrides) gives them.
aero::TrainedModel load_mdlus(const InferOptions& o, const aero::Config& config,
                              c10::Device device) {
  const auto spec = aero::resolve_run_spec(config);
  const auto layout = aero::open_named_split(spec, o.split, o.data)->layout();
  return aero::trained_from_mdlus(o.checkpoint, config, layout, device);
}

// The recipe's `infer_split=NAME` is --split NAME.
InferOptions with_infer_split(InferOptions o) {
  std::vector<std::string> rest;
  for (const auto& kv : o.overrides) {
    if (kv.rfind("infer_split=", 0) != 0) {
      rest.push_back(kv);
      continue;
    }
    const std::string split = kv.substr(std::strlen("infer_split="));
    TORCH_CHECK(o.split.empty() || o.split == split, "infer: --split ", o.split, " and ", kv,
                " disagree");
    o.split = split;
  }
  o.overrides = rest;
  return o;
}

// A .json infer --in wrote: it names the run and the checkpoint.
bool is_single_run_record(const std::string& path) {
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("run") && j.contains("checkpoint");
}

// Nothing infer writes may land on its inputs, a training run, a dataset or
// a file infer did not write (output_guard.h).
void check_outputs(const InferOptions& o) {
  if (!o.split.empty()) {
    if (o.out.empty()) return;  // eval without --out writes nothing
    check_output_directory(o.out, {o.checkpoint, o.data}, "metrics.jsonl",
                           [](const std::string& p) { return first_record_is(p, "infer_config"); });
    return;
  }
  fs::path stem = o.out;
  stem.replace_extension("");
  const std::string record = stem.string() + ".json";
  const std::vector<std::string> inputs{o.run_dir, o.checkpoint};
  check_output_file(record, inputs, is_single_run_record);
  // A mesh of that name is ours when its record is.
  for (const char* ext : {".vtu", ".vtp"}) {
    check_output_file(stem.string() + ext, inputs, [&](const std::string&) {
      return fs::exists(record) && is_single_run_record(record);
    });
  }
}

// Launched on several ranks (`slipstream launch --nproc D -- infer ...`),
// they form one domain group: each sample's points are split over them
// (TrainedModel::domain_group), for --split.
int run_infer(const InferOptions& options, const CommandContext& context) {
  const InferOptions o = with_infer_split(options);
  TORCH_CHECK(o.run_dir.empty() != o.split.empty(),
              "infer: give exactly one of --in RUN (a raw run) and --split NAME (a split)");
  TORCH_CHECK(o.overrides.empty() || aero::is_mdlus_path(o.checkpoint),
              "infer: key=value overrides apply to a .mdlus only; a Slipstream checkpoint "
              "brings its own config");
  const auto env = DistributedEnv::from_environment();
  TORCH_CHECK(env.world_size == 1 || !o.split.empty(),
              "infer: over several ranks, predict a split (--split NAME); --in RUN runs on one");
  check_outputs(o);  // before any work
  // The checkpoint is read once, before the process group: its config
  // gives the group's timeout (a .mdlus: configs/ and the overrides).
  const bool mdlus = aero::is_mdlus_path(o.checkpoint);
  TORCH_CHECK(!mdlus || !o.split.empty(),
              "infer: a .mdlus predicts a split (--split NAME [--data DIR]);"
              " for a raw run, prepare it first");
  std::optional<aero::TrainedCheckpoint> checkpoint;
  std::optional<aero::Config> mdlus_config;
  if (mdlus) {
    mdlus_config = aero::Config::load(context.config_dir, o.overrides);
  } else {
    checkpoint = aero::read_trained(o.checkpoint);
  }
  const aero::Config& config = mdlus ? *mdlus_config : checkpoint->config;
  const aero::Runtime runtime =
      aero::open_runtime(o.device, env, aero::resolve_settings(config).distributed_timeout_s);
  aero::TrainedModel trained = mdlus ? load_mdlus(o, config, runtime.device)
                                     : aero::load_trained(*checkpoint, runtime.device);
  trained.domain_group = runtime.comm.get();
  if (!o.split.empty()) return run_split(o, trained, runtime.device);
#ifdef SLIPSTREAM_WITH_VTK
  return run_single(o, trained, runtime.device);
#else
  needs_vtk("infer --in RUN");
#endif
}

}  // namespace

Command add_infer(CLI::App& app, const CommandContext& context) {
  auto o = std::make_shared<InferOptions>();
  auto* sub = app.add_subcommand(
      "infer", "predict a raw run (--in) or a whole split (--split) at full resolution");
  sub->add_option("--checkpoint", o->checkpoint,
                  "checkpoint file, checkpoints/ directory, run directory or PhysicsNeMo .mdlus")
      ->required();
  sub->add_option("--in", o->run_dir, "a raw run directory (volume .vtu + .stl, or surface .vtp)");
  sub->add_option("--split", o->split, "a split of the sample directory: train, val, test, ...");
  sub->add_option("--data", o->data, "sample directory for --split (default: the run's)");
  sub->add_option("--out", o->out, "--in: output .vtu/.vtp; --split: output directory")->required();
  sub->add_option("--device", o->device, "auto, cpu or cuda");
  sub->add_option("overrides", o->overrides,
                  "infer_split=NAME (as --split); with a .mdlus: key=value config (model.*, "
                  "dataset=...) it lacks");
  o->fields.add_to(sub);
  return {sub, [o, &context]() -> int { return run_infer(*o, context); }};
}

Command add_eval(CLI::App& app, const CommandContext& context) {
  auto o = std::make_shared<InferOptions>();
  o->split = "val";
  o->write_meshes = false;
  auto* sub = app.add_subcommand(
      "eval", "a split's metrics and forces from a checkpoint, at full resolution, no meshes");
  sub->add_option("--checkpoint", o->checkpoint,
                  "checkpoint file, checkpoints/ directory, run directory or PhysicsNeMo .mdlus")
      ->required();
  sub->add_option("--split", o->split, "a split of the sample directory (default: val)");
  sub->add_option("--data", o->data, "sample directory (default: the run's)");
  sub->add_option("--out", o->out, "a directory for metrics.jsonl and forces.svg (default: none)");
  sub->add_option("--device", o->device, "auto, cpu or cuda");
  sub->add_option("overrides", o->overrides,
                  "with a .mdlus: key=value config (model.*, dataset=...) it lacks");
  return {sub, [o, &context]() -> int { return run_infer(*o, context); }};
}

}  // namespace slipstream::app
