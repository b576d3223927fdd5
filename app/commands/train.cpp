// slipstream train [--audit-syncs] [key=value ...]
#include "aero/train/run.h"
#include "aero/train/trainer.h"
#include "commands/commands.h"
#include "core/process/exit_error.h"
#include "core/process/stop_signal.h"

#include <c10/util/Exception.h>

#include <cstring>
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
  return {sub, [o, &context]() -> int {
            const auto config = aero::Config::load(context.config_dir, o->overrides);
            const auto env = DistributedEnv::from_environment();
            if (env.rank == 0 && env.launcher != "none") {
              std::cout << "Launch: " << env.describe() << std::endl;
            }
            auto run = aero::build_run(config, env);
            try {
              aero::Trainer trainer(*run);
              if (o->audit_syncs) trainer.set_sync_audit(true);
              const auto result = trainer.fit();
              if (run->rank == 0) {
                std::cout << "Run directory: " << result.run_dir << "\n";
                if (o->audit_syncs) std::cout << trainer.sync_audit_report();
              }
              if (result.stop_signal == 0) return 0;
              if (run->rank == 0) {
                std::cerr << "slipstream: stopped by " << strsignal(result.stop_signal)
                          << " after step " << trainer.global_step() << "; the checkpoint is in "
                          << result.run_dir << "/checkpoints (the same command resumes)\n";
              }
              return StopSignals::exit_code(result.stop_signal);
            } catch (...) {
              rethrow_with_diagnosis(*run);
            }
          }};
}

}  // namespace slipstream::app
