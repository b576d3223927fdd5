// slipstream train [--audit-syncs] [key=value ...]
#include "aero/train/run.h"
#include "aero/train/run_summary.h"
#include "aero/train/trainer.h"
#include "commands/commands.h"
#include "core/process/exit_error.h"
#include "core/process/stop_signal.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>

namespace slipstream::app {

void rethrow_with_diagnosis(aero::Run& run) {
  std::exception_ptr error = std::current_exception();
  if (!run.comm || run.world_size <= 1) std::rethrow_exception(error);
  std::string what;
  int code = 1;
  try {
    std::rethrow_exception(error);
  } catch (const ExitError& e) {
    what = e.what();
    code = e.code();
  } catch (const c10::Error& e) {
    what = e.what_without_backtrace();
  } catch (const std::exception& e) {
    what = e.what();
  }
  const std::string diagnosis = run.comm->diagnose_failure(what);
  if (diagnosis.empty()) std::rethrow_exception(error);
  throw ExitError(code, what + "\n" + diagnosis);
}

std::string config_choices(const std::string& config_dir) {
  std::string out = "Config (" + config_dir + "/train.yaml and its groups; any key: key=value):";
  for (const char* group : {"model", "dataset"}) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(config_dir + "/" + group, ec)) {
      if (e.path().extension() == ".yaml") names.push_back(e.path().stem().string());
    }
    std::sort(names.begin(), names.end());
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : " | ") + n;
    out += std::string("\n  ") + group + "=" + (list.empty() ? "(none found)" : list);
  }
  out +=
      "\n  e.g. training.num_epochs=20 optimizer.lr=3e-4 dataset.path=DIR device=cpu"
      "\n  run_id=NAME continues or names a run (default: the newest unfinished run of the same"
      "\n  config, else a new timestamp); runs go to output_dir (runs/)";
  return out;
}

Command add_train(CLI::App& app, const CommandContext& context) {
  struct Options {
    bool audit_syncs = false;
    std::vector<std::string> overrides;
  };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand("train", "train a model (key=value overrides the config)");
  sub->add_flag("--audit-syncs", o->audit_syncs,
                "count synchronizing CUDA calls per step and attribute them to a phase");
  sub->add_option("overrides", o->overrides, "key=value config overrides");
  sub->footer(config_choices(context.config_dir));
  return {sub, [o, &context]() -> int {
            const auto config = aero::Config::load(context.config_dir, o->overrides);
            const auto env = DistributedEnv::from_environment();
            if (env.rank == 0 && env.launcher != "none") {
              std::cout << "Launch: " << env.describe() << std::endl;
            }
            if (env.rank == 0) {
              const bool on_disk = config.has("dataset.path") && !config.is_null("dataset.path");
              const std::string path =
                  on_disk ? config.get<std::string>("dataset.path") : std::string("in memory");
              std::cout << "Starting: model=" << config.get<std::string>("defaults.model")
                        << " dataset=" << config.get<std::string>("defaults.dataset") << " ("
                        << path << "); opening the data and building the model" << std::endl;
            }
            auto run = aero::build_run(config, env);
            try {
              aero::Trainer trainer(*run);
              if (o->audit_syncs) trainer.set_sync_audit(true);
              std::vector<std::string> words = context.argv;
              if (!words.empty()) words.front() = "slipstream";
              trainer.set_invocation({{"argv", words},
                                      {"command_line", aero::shell_command(words)},
                                      {"overrides", o->overrides},
                                      {"version", context.version},
                                      {"commit", context.commit},
                                      {"launcher", env.launcher},
                                      {"world_size", run->world_size}});
              const auto result = trainer.fit();
              if (run->rank == 0) {
                std::cout << aero::format_run_summary(result.summary);
                if (o->audit_syncs) std::cout << trainer.sync_audit_report();
              }
              if (result.stop_signal == 0) return 0;
              if (run->rank == 0) {
                std::cerr << "slipstream: stopped by " << strsignal(result.stop_signal)
                          << " after step " << trainer.global_step() << "; the checkpoint is in "
                          << result.run_dir
                          << "/checkpoints; the same command continues the run "
                             "(training.resume=auto), as does: "
                          << result.summary["next"].value("continue", std::string()) << "\n";
              }
              return StopSignals::exit_code(result.stop_signal);
            } catch (...) {
              rethrow_with_diagnosis(*run);
            }
          }};
}

}  // namespace slipstream::app
