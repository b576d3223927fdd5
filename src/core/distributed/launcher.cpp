#include "core/distributed/launcher.h"

#include <c10/util/Exception.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

extern char** environ;

namespace slipstream {
namespace {

std::atomic<int> forward_signal{0};
std::atomic<int> signals_seen{0};

void on_launcher_signal(int sig) {
  forward_signal.store(sig);
  signals_seen.fetch_add(1);
}

std::vector<std::string> child_environment(const LaunchOptions& o, int local_rank,
                                           const std::string& reports) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    bool ours = false;
    for (const char* k :
         {"RANK=", "LOCAL_RANK=", "WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=", "GROUP_RANK=",
          "GROUP_WORLD_SIZE=", "LOCAL_WORLD_SIZE=", "SLIPSTREAM_LAUNCH_REPORTS="}) {
      ours |= kv.rfind(k, 0) == 0;
    }
    if (!ours) env.push_back(kv);
  }
  env.push_back("RANK=" + std::to_string(o.node_rank * o.nproc + local_rank));
  env.push_back("LOCAL_RANK=" + std::to_string(local_rank));
  env.push_back("WORLD_SIZE=" + std::to_string(o.nnodes * o.nproc));
  env.push_back("GROUP_RANK=" + std::to_string(o.node_rank));
  env.push_back("GROUP_WORLD_SIZE=" + std::to_string(o.nnodes));
  env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(o.nproc));
  env.push_back("MASTER_ADDR=" + o.master_addr);
  env.push_back("MASTER_PORT=" + std::to_string(o.master_port));
  env.push_back("SLIPSTREAM_LAUNCH_REPORTS=" + reports);
  return env;
}

pid_t start_rank(const std::string& program, const std::vector<std::string>& args,
                 std::vector<std::string> env) {
  std::vector<std::string> argv_s{program};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv, envp;
  argv.reserve(argv_s.size() + 1);
  envp.reserve(env.size() + 1);
  for (auto& s : argv_s) argv.push_back(s.data());
  for (auto& s : env) envp.push_back(s.data());
  argv.push_back(nullptr);
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // The child: die with the launcher, even if it is killed with -9.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(137);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    execve(program.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  return pid;
}

// The ranks a failed rank's report blames, and the report; empty if none.
std::pair<std::string, std::string> read_report(const std::string& dir, int rank) {
  std::ifstream in(dir + "/rank_" + std::to_string(rank));
  if (!in.good()) return {};
  std::string blamed, line, text;
  std::getline(in, blamed);
  while (std::getline(in, line)) text += (text.empty() ? "" : "\n") + line;
  return {blamed, text};
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) {
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "exited with " + std::to_string(WEXITSTATUS(status));
}

}  // namespace

int launch_local_ranks(const LaunchOptions& o, const std::string& program,
                       const std::vector<std::string>& args) {
  const int nproc = o.nproc;
  TORCH_CHECK(nproc >= 1, "launch: --nproc must be >= 1, got ", nproc);
  TORCH_CHECK(o.nnodes >= 1, "launch: --nnodes must be >= 1, got ", o.nnodes);
  TORCH_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, "launch: --node-rank ", o.node_rank,
              " is not between 0 and ", o.nnodes - 1, " (--nnodes ", o.nnodes, ")");
  TORCH_CHECK(o.master_port > 0 && o.master_port < 65536, "launch: --master-port ", o.master_port,
              " is not a valid port");
  TORCH_CHECK(!o.master_addr.empty(), "launch: --master-addr is empty");
  const int first_rank = o.node_rank * nproc;
  char reports_template[] = "/tmp/slipstream-launch-XXXXXX";
  const char* reports_dir = mkdtemp(reports_template);
  TORCH_CHECK(reports_dir != nullptr,
              "launch: cannot create a report directory: ", std::strerror(errno));
  const std::string reports = reports_dir;
  struct sigaction sa {};
  sa.sa_handler = on_launcher_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);

  std::vector<pid_t> pids;
  for (int local = 0; local < nproc; ++local) {
    const pid_t pid = start_rank(program, args, child_environment(o, local, reports));
    TORCH_CHECK(pid > 0, "launch: cannot start rank ", first_rank + local, " (", program,
                "): ", std::strerror(errno));
    pids.push_back(pid);
  }
  auto signal_all = [&](int sig) {
    for (pid_t p : pids) {
      if (p > 0) kill(p, sig);
    }
  };
  int result = 0, forwarded = 0;
  size_t alive = pids.size();
  std::chrono::steady_clock::time_point kill_at = std::chrono::steady_clock::time_point::max();
  while (alive > 0) {
    if (const int seen = signals_seen.load(); seen > forwarded) {
      // First signal: forward it (the ranks checkpoint and exit); second: kill.
      signal_all(seen == 1 ? forward_signal.load() : SIGKILL);
      forwarded = seen;
    }
    if (std::chrono::steady_clock::now() >= kill_at) {
      signal_all(SIGKILL);
      kill_at = std::chrono::steady_clock::time_point::max();
    }
    int status = 0;
    const pid_t done = waitpid(-1, &status, WNOHANG);
    if (done < 0 && errno != EINTR) break;
    if (done <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    --alive;
    int rank = -1;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] == done) {
        rank = first_rank + static_cast<int>(i);
        pids[i] = 0;
      }
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code == 0 || result != 0) continue;
    result = code;
    if (forwarded > 0) continue;  // the ranks are stopping on the user's signal
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // its report, if any
    const auto [blamed, report] = read_report(reports, rank);
    if (!blamed.empty() && blamed != std::to_string(rank)) {
      std::cerr << "launch: rank " << blamed << " caused the failure: rank " << rank << " "
                << describe_exit(status) << " because\n"
                << report << "\nlaunch: stopping the other ranks\n";
    } else {
      std::cerr << "launch: rank " << rank << " " << describe_exit(status)
                << "; stopping the other ranks\n";
    }
    signal_all(SIGTERM);
    kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  }
  for (int rank = first_rank; rank < first_rank + nproc; ++rank) {
    std::remove((reports + "/rank_" + std::to_string(rank)).c_str());
  }
  rmdir(reports.c_str());
  return result;
}

}  // namespace slipstream
