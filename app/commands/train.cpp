// slipstream train [--audit-syncs] [key=value ...]
#include "aero/train/run.h"
#include "aero/train/trainer.h"
#include "commands/commands.h"

#include <iostream>
#include <memory>

namespace slipstream::app {

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
  return {sub, [o, &context] {
            const auto config = aero::Config::load(context.config_dir, o->overrides);
            auto run = aero::build_run(config, DistributedEnv::from_environment());
            aero::Trainer trainer(*run);
            if (o->audit_syncs) trainer.set_sync_audit(true);
            const auto result = trainer.fit();
            if (run->rank == 0) {
              std::cout << "Run directory: " << result.run_dir << "\n";
              if (o->audit_syncs) std::cout << trainer.sync_audit_report();
            }
            return 0;
          }};
}

}  // namespace slipstream::app
