// slipstream: the command-line front end. Thin: parses arguments and hands
// off to the aero recipe.
//   slipstream train [key=value ...]
//   slipstream bench [key=value ...]
//   slipstream info  [key=value ...]
//   slipstream make-synthetic --out DIR [key=value ...]
#include "aero/config/config.h"
#include "aero/data/dataset.h"
#include "aero/device/device.h"
#include "aero/model/transolver.h"
#include "aero/train/bench.h"
#include "aero/train/trainer.h"
#include "core/distributed/launcher.h"
#ifdef SLIPSTREAM_WITH_VTK
#include "aero/vtk/infer.h"
#include "aero/vtk/raw_runs.h"
#endif
#include "core/distributed/process_group.h"

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <chrono>
#include <iostream>
#include <map>

namespace {

using namespace slipstream;
using namespace slipstream::aero;

int run_train(const std::string& config_dir, const std::vector<std::string>& overrides,
              bool audit_syncs) {
  const Config config = Config::load(config_dir, overrides);
  const TrainSettings settings = resolve_settings(config);
  const DistributedEnv env = DistributedEnv::from_environment();
  const c10::Device device = resolve_device(settings.device, env.local_rank);
  ProcessGroupOptions pg;
  pg.timeout = std::chrono::seconds(settings.distributed_timeout_s);
  auto comm = init_process_group(env, device, pg);
  Trainer trainer(settings, config.to_yaml(), comm.get(), env.local_rank);
  if (audit_syncs) trainer.set_sync_audit(true);
  const TrainResult result = trainer.fit();
  if (env.rank == 0) {
    std::cout << "Run directory: " << result.run_dir << "\n";
    if (audit_syncs) std::cout << trainer.sync_audit_report();
  }
  return 0;
}

int run_info(const std::string& config_dir, const std::vector<std::string>& overrides) {
  const Config config = Config::load(config_dir, overrides);
  const TrainSettings settings = resolve_settings(config);
  std::cout << config.to_yaml();
  Transolver model(settings.model);
  std::cout << "parameters: " << model->parameter_count() << "\n";
  return 0;
}

#ifndef SLIPSTREAM_WITH_VTK
[[noreturn]] void no_vtk(const char* what) {
  TORCH_CHECK(false, what, " needs VTK; this slipstream was built without it (install libvtk9-dev "
              "and rebuild)");
}
#endif

int run_make_synthetic(const std::string& config_dir, const std::vector<std::string>& overrides,
                       const std::string& out, const std::string& format) {
  const Config config = Config::load(config_dir, overrides);
  const TrainSettings s = resolve_settings(config);
  TORCH_CHECK(format == "samples" || format == "vtk", "make-synthetic: --format '", format,
              "' is not one of samples, vtk");
  if (format == "vtk") {
#ifdef SLIPSTREAM_WITH_VTK
    write_synthetic_vtk_runs(out, s.synthetic, s.num_train + s.num_val);
    std::cout << "Wrote " << s.num_train + s.num_val << " runs (.vtu + .stl + metadata.json) of "
              << s.synthetic.points_per_sample << " points to " << out << "\n";
    return 0;
#else
    no_vtk("make-synthetic --format vtk");
#endif
  }
  write_synthetic_directory(out, s.synthetic, s.num_train, s.num_val);
  std::cout << "Wrote " << s.num_train << " train and " << s.num_val << " val samples of "
            << s.synthetic.points_per_sample << " points to " << out << "\n";
  return 0;
}

}  // namespace

// slipstream launch --nproc N [--port P] -- train ...: starts N local ranks.
int run_launch(int argc, char** argv) {
  int nproc = 1, port = 29500;
  std::vector<std::string> rest;
  bool after_dashes = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (after_dashes) {
      rest.push_back(a);
    } else if (a == "--") {
      after_dashes = true;
    } else if ((a == "--nproc" || a == "--port") && i + 1 < argc) {
      (a == "--nproc" ? nproc : port) = std::stoi(argv[++i]);
    } else {
      std::cerr << "usage: slipstream launch --nproc N [--port P] -- train [key=value ...]\n";
      return 2;
    }
  }
  if (rest.empty()) {
    std::cerr << "slipstream launch: nothing to run after --\n";
    return 2;
  }
  return launch_local_ranks(nproc, port, "/proc/self/exe", rest);
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "launch") {
    try {
      return run_launch(argc, argv);
    } catch (const std::exception& e) {
      std::cerr << "slipstream: error: " << e.what() << "\n";
      return 1;
    }
  }
  CLI::App app{"Slipstream: Transolver training for external aerodynamics, with per-step "
               "logging that never makes the host wait for the GPU"};
  app.require_subcommand(1);
  std::string config_dir = default_config_dir();
  app.add_option("--config-dir", config_dir, "directory holding train.yaml, model/, dataset/");
  std::vector<std::string> overrides;

  auto* train = app.add_subcommand("train", "train a model (key=value overrides the config)");
  bool audit_syncs = false;
  train->add_flag("--audit-syncs", audit_syncs,
                  "count synchronizing CUDA calls per step and attribute them to a phase");
  train->add_option("overrides", overrides, "key=value config overrides");

  auto* bench = app.add_subcommand("bench", "time train steps per readback policy");
  BenchOptions bench_opts;
  bench->add_option("--rounds", bench_opts.rounds, "rounds of interleaved policies");
  bench->add_option("--steps", bench_opts.steps_per_round, "timed steps per policy and round");
  bench->add_option("--warmup", bench_opts.warmup_steps, "untimed steps before each timed block");
  bench->add_option("--policies", bench_opts.policies, "readback policies to compare");
  bench->add_flag("--audit-syncs", bench_opts.audit_syncs, "count synchronizing CUDA calls");
  bench->add_flag("--profile", bench_opts.profile,
                  "then profile one round: device time per kernel and step");
  bench->add_option("overrides", overrides, "key=value config overrides");

  app.add_subcommand("launch", "launch --nproc N [--port P] -- train ...: N local ranks");
  auto* info = app.add_subcommand("info", "print the resolved config and parameter count");
  info->add_option("overrides", overrides, "key=value config overrides");

  auto* synth = app.add_subcommand("make-synthetic", "write the synthetic dataset to disk");
  std::string out;
  synth->add_option("--out", out, "output directory")->required();
  synth->add_option("overrides", overrides, "key=value config overrides");

  std::string format = "samples";
  synth->add_option("--format", format, "samples (the trainer's format) or vtk (raw runs)");

  auto* prepare = app.add_subcommand("prepare", "raw VTK/STL runs -> the trainer's samples");
  std::string prep_in, prep_out;
  double val_fraction = 0.25;
  std::map<std::string, std::string> field_names{{"velocity", "UMeanTrim"},
                                                 {"pressure", "pMeanTrim"},
                                                 {"nut", "nutMeanTrim"}};
  prepare->add_option("--in", prep_in, "directory of run directories")->required();
  prepare->add_option("--out", prep_out, "output directory")->required();
  prepare->add_option("--val-fraction", val_fraction, "share of runs for validation");
  for (auto* cmd : {prepare}) {
    cmd->add_option("--velocity-field", field_names["velocity"], "velocity field in the .vtu");
    cmd->add_option("--pressure-field", field_names["pressure"], "pressure field in the .vtu");
    cmd->add_option("--nut-field", field_names["nut"], "turbulent viscosity field in the .vtu");
  }
  auto* infer = app.add_subcommand("infer", "predict every point of a raw run into a .vtu");
  std::string infer_ckpt, infer_in, infer_out, infer_device = "auto";
  infer->add_option("--checkpoint", infer_ckpt, "checkpoint file or checkpoints/ directory")->required();
  infer->add_option("--in", infer_in, "a raw run directory (.vtu, .stl, metadata.json)")->required();
  infer->add_option("--out", infer_out, "output .vtu (metrics go beside it as .json)")->required();
  infer->add_option("--device", infer_device, "auto, cpu or cuda");
  infer->add_option("--velocity-field", field_names["velocity"], "velocity field in the .vtu");
  infer->add_option("--pressure-field", field_names["pressure"], "pressure field in the .vtu");
  infer->add_option("--nut-field", field_names["nut"], "turbulent viscosity field in the .vtu");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*train) return run_train(config_dir, overrides, audit_syncs);
    if (*bench) return run_bench(config_dir, overrides, bench_opts);
    if (*info) return run_info(config_dir, overrides);
    if (*synth) return run_make_synthetic(config_dir, overrides, out, format);
    if (*prepare) {
#ifdef SLIPSTREAM_WITH_VTK
      PrepareOptions po;
      po.fields = field_names;
      po.val_fraction = val_fraction;
      const auto r = prepare_runs(prep_in, prep_out, po);
      std::cout << "Prepared " << r.runs << " runs (" << r.train << " train, " << r.val
                << " val, " << r.points << " points) into " << prep_out << " in " << r.seconds
                << " s\n";
      return 0;
#else
      no_vtk("prepare");
#endif
    }
    if (*infer) {
#ifdef SLIPSTREAM_WITH_VTK
      InferOptions io;
      io.checkpoint = infer_ckpt;
      io.run_dir = infer_in;
      io.out = infer_out;
      io.fields = field_names;
      io.device = infer_device;
      const auto r = run_inference(io);
      std::cout << "Wrote " << infer_out << " (" << r.points << " points); metrics in "
                << r.metrics_path << ":";
      for (const auto& [k, v] : r.metrics) std::cout << " " << k << "=" << v;
      std::cout << "\n";
      return 0;
#else
      no_vtk("infer");
#endif
    }
  } catch (const c10::Error& e) {
    std::cerr << "slipstream: error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "slipstream: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
