// slipstream launch [--nnodes N --node-rank R --master-addr HOST]
//   [--master-port P] --nproc K -- train [key=value ...]: K ranks of this
// executable on this node of an N-node process group (torchrun's static
// rendezvous: every node runs the same command with its own --node-rank).
#include "commands/commands.h"
#include "core/distributed/launcher.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <memory>
#include <thread>

namespace slipstream::app {

Command add_launch(CLI::App& app, const CommandContext& context) {
  struct Options {
    LaunchOptions launch;
    std::string master_addr;
    std::vector<std::string> command;
  };
  auto o = std::make_shared<Options>();
  auto* sub = app.add_subcommand(
      "launch",
      "launch [--nnodes N --node-rank R --master-addr HOST] --nproc K -- train ...: K ranks "
      "on this node");
  sub->add_option("--nproc,--nproc-per-node", o->launch.nproc,
                  "ranks to start on this node (1 to 4 per CPU core)");
  sub->add_option("--nnodes", o->launch.nnodes, "nodes in the group (each runs this command)");
  sub->add_option("--node-rank", o->launch.node_rank, "this node's rank, 0 to nnodes-1");
  sub->add_option("--master-addr", o->master_addr,
                  "the host of node rank 0, reachable from every node (127.0.0.1 on one node)");
  sub->add_option("--master-port,--port", o->launch.master_port,
                  "the rendezvous port on the master host");
  sub->add_option("command", o->command, "the slipstream command each rank runs, after --");
  return {sub, [o] {
            TORCH_CHECK(!o->command.empty(), "launch: nothing to run after --");
            // Every rank is a process with its own model and data: more than
            // a few per core only exhausts the machine.
            const int cores = std::max(1u, std::thread::hardware_concurrency());
            TORCH_CHECK(o->launch.nproc >= 1 && o->launch.nproc <= 4 * cores, "launch: --nproc ",
                        o->launch.nproc, " is not between 1 and ", 4 * cores,
                        " (4 ranks per CPU core; this machine has ", cores, ")");
            TORCH_CHECK(o->launch.nnodes == 1 || !o->master_addr.empty(), "launch: --nnodes ",
                        o->launch.nnodes,
                        " needs --master-addr, the host of node rank 0 as every node can reach "
                        "it (the same on every node)");
            if (!o->master_addr.empty()) o->launch.master_addr = o->master_addr;
            return launch_local_ranks(o->launch, "/proc/self/exe", o->command);
          }};
}

}  // namespace slipstream::app
