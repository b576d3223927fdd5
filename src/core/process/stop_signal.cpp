#include "core/process/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace slipstream {
namespace {

std::atomic<int> first_signal{0};
std::atomic<bool> installed{false};

void write_message(const char* text) {
  // Only async-signal-safe calls here.
  const ssize_t ignored = write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

void on_signal(int sig) {
  int expected = 0;
  if (first_signal.compare_exchange_strong(expected, sig)) {
    write_message(sig == SIGINT   ? "\nslipstream: SIGINT: finishing the step, then a checkpoint; "
                                    "a second signal exits at once\n"
                  : sig == SIGHUP ? "\nslipstream: SIGHUP (the terminal went away): finishing the "
                                    "step, then a checkpoint; a second signal exits at once\n"
                                  : "\nslipstream: SIGTERM: finishing the step, then a checkpoint; "
                                    "a second signal exits at once\n");
    return;
  }
  write_message("slipstream: second signal: exiting now\n");
  _exit(128 + sig);
}

}  // namespace

void StopSignals::install() {
  if (installed.exchange(true)) return;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
}

int StopSignals::requested() { return first_signal.load(std::memory_order_relaxed); }

void StopSignals::clear() { first_signal.store(0); }

}  // namespace slipstream
