#include "core/distributed/launcher.h"

#include <c10/util/Exception.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <thread>

extern char** environ;

namespace slipstream {

int launch_local_ranks(int nproc, int master_port, const std::string& program,
                       const std::vector<std::string>& args) {
  TORCH_CHECK(nproc >= 1, "launch: --nproc must be >= 1, got ", nproc);
  TORCH_CHECK(master_port > 0 && master_port < 65536, "launch: bad port ", master_port);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < nproc; ++rank) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      bool ours = false;
      for (const char* k :
           {"RANK=", "LOCAL_RANK=", "WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT="}) {
        ours |= kv.rfind(k, 0) == 0;
      }
      if (!ours) env.push_back(kv);
    }
    env.push_back("RANK=" + std::to_string(rank));
    env.push_back("LOCAL_RANK=" + std::to_string(rank));
    env.push_back("WORLD_SIZE=" + std::to_string(nproc));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back("MASTER_PORT=" + std::to_string(master_port));
    std::vector<char*> envp;
    envp.reserve(env.size() + 1);
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_s{program};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    argv.reserve(argv_s.size() + 1);
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, program.c_str(), nullptr, nullptr, argv.data(), envp.data());
    TORCH_CHECK(rc == 0, "launch: cannot start rank ", rank, " (", program,
                "): ", std::strerror(rc));
    pids.push_back(pid);
  }
  int result = 0;
  size_t alive = pids.size();
  while (alive > 0) {
    int status = 0;
    const pid_t done = wait(&status);
    if (done < 0) break;
    --alive;
    int rank = -1;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] == done) {
        rank = static_cast<int>(i);
        pids[i] = 0;
      }
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && result == 0) {
      result = code;
      std::cerr << "launch: rank " << rank << " exited with " << code
                << "; stopping the other ranks\n";
      for (pid_t p : pids) {
        if (p > 0) kill(p, SIGTERM);
      }
      std::thread([pids] {
        std::this_thread::sleep_for(std::chrono::seconds(10));
        for (pid_t p : pids) {
          if (p > 0) kill(p, SIGKILL);
        }
      }).detach();
    }
  }
  return result;
}

}  // namespace slipstream
