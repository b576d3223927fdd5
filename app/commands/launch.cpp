// slipstream launch --nproc N [--port P] -- train [key=value ...]: N local
// ranks of this executable as one process group (torchrun-style variables).
#include "commands/commands.h"
#include "core/distributed/launcher.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <memory>
#include <thread>

namespace slipstream::app {

Command add_launch(CLI::App& app, const CommandContext& context) {
  struct Options {
    int nproc = 1, port = 29500;
    std::vector<std::string> command;
  };
  auto o = std::make_shared<Options>();
  auto* sub =
      app.add_subcommand("launch", "launch --nproc N [--port P] -- train ...: N local ranks");
  sub->add_option("--nproc", o->nproc, "ranks to start (1 to 4 per CPU core)");
  sub->add_option("--port", o->port, "MASTER_PORT of the rendezvous");
  sub->add_option("command", o->command, "the slipstream command each rank runs, after --");
  return {sub, [o] {
            TORCH_CHECK(!o->command.empty(), "launch: nothing to run after --");
            // Every rank is a process with its own model and data: more than
            // a few per core only exhausts the machine.
            const int cores = std::max(1u, std::thread::hardware_concurrency());
            TORCH_CHECK(o->nproc >= 1 && o->nproc <= 4 * cores, "launch: --nproc ", o->nproc,
                        " is not between 1 and ", 4 * cores,
                        " (4 ranks per CPU core; this machine has ", cores, ")");
            return launch_local_ranks(o->nproc, o->port, "/proc/self/exe", o->command);
          }};
}

}  // namespace slipstream::app
