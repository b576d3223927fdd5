#include "support/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace slipstream::testing {

namespace {
std::atomic<int> counter{0};
}  // namespace

Process::Process(const std::string& bin, const std::vector<std::string>& args,
                 const std::vector<std::string>& env) {
  log_ = (std::filesystem::temp_directory_path() / ("slipstream-test-" + std::to_string(getpid()) +
                                                    "-" + std::to_string(counter++) + ".log"))
             .string();
  // Everything the child touches is prepared before fork (no allocation after).
  std::vector<std::string> argv_s{bin}, env_s = env;
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + log_);
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    for (auto& e : env_s) putenv(e.data());
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  close(fd);
}

Process::~Process() {
  if (!reaped_ && pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status_, 0);
  }
  std::remove(log_.c_str());
}

void Process::signal(int sig) const {
  if (!reaped_) kill(pid_, sig);
}

bool Process::running() {
  if (reaped_) return false;
  if (waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
  return !reaped_;
}

Exit Process::wait(std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool timed_out = false;
  while (running()) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status_, 0);
      reaped_ = true;
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Exit e;
  e.exited = !timed_out && WIFEXITED(status_);
  e.code = WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
  e.output = output();
  if (timed_out) e.output += "\n[test: killed at the deadline]";
  return e;
}

std::string Process::output() const {
  std::ifstream in(log_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string slipstream_bin() {
  const char* bin = std::getenv("SLIPSTREAM_BIN");
  if (bin == nullptr) throw std::runtime_error("SLIPSTREAM_BIN is not set (run through ctest)");
  return bin;
}

Exit run_slipstream(const std::vector<std::string>& args, std::chrono::seconds timeout,
                    const std::vector<std::string>& env) {
  Process p(slipstream_bin(), args, env);
  return p.wait(timeout);
}

std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: comm may hold spaces, so read after the last ')'.
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == pid && state != 'Z') out.push_back(std::stoi(name));
  }
  return out;
}

bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto close = line.rfind(')');
  return close != std::string::npos && line.size() > close + 2 && line[close + 2] != 'Z';
}

bool eventually(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

}  // namespace slipstream::testing
