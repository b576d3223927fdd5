// Child processes for the tests that run the slipstream executable as a user
// does: started in the background with their output captured, signalled,
// waited for with a deadline; and the processes a launcher started.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

// A failed expectation shows what was looked for and the whole output.
#define EXPECT_OUTPUT_HAS(exit, text)                                                        \
  EXPECT_NE((exit).output.find(text), std::string::npos) << "looked for: " << (text) << "\n" \
                                                         << (exit).output

namespace slipstream::testing {

struct Exit {
  bool exited = false;  // false: killed by a signal, or still running at the deadline
  int code = -1;        // exit code, or 128 + signal when killed
  std::string output;   // stdout and stderr together
};

class Process {
 public:
  // Starts `bin args...` with extra environment entries ("NAME=value").
  Process(const std::string& bin, const std::vector<std::string>& args,
          const std::vector<std::string>& env = {});
  ~Process();  // kills it if it still runs
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig) const;
  bool running();
  // Waits up to `timeout`; a process still running then is killed (SIGKILL)
  // and reported with exited = false.
  Exit wait(std::chrono::seconds timeout);
  // What it has printed so far.
  std::string output() const;

 private:
  pid_t pid_ = -1;
  std::string log_;
  bool reaped_ = false;
  int status_ = 0;
};

// The slipstream executable ($SLIPSTREAM_BIN).
std::string slipstream_bin();

// Runs `slipstream args...` to completion (at most `timeout`).
Exit run_slipstream(const std::vector<std::string>& args,
                    std::chrono::seconds timeout = std::chrono::seconds(60),
                    const std::vector<std::string>& env = {});

// The live processes whose parent is `pid`.
std::vector<pid_t> children_of(pid_t pid);
bool alive(pid_t pid);

// Polls `done` every 10 ms for up to `timeout`; true once it holds.
bool eventually(const std::function<bool()>& done, std::chrono::milliseconds timeout);

}  // namespace slipstream::testing
