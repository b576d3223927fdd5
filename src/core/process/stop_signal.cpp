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

char stop_note[208] = "finishing the step, then a checkpoint";

void on_signal(int sig) {
  int expected = 0;
  if (first_signal.compare_exchange_strong(expected, sig)) {
    write_message(sig == SIGINT   ? "\nslipstream: SIGINT: "
                  : sig == SIGHUP ? "\nslipstream: SIGHUP (the terminal went away): "
                                  : "\nslipstream: SIGTERM: ");
    write_message(stop_note);
    write_message("; a second signal exits at once\n");
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

void StopSignals::set_stop_note(const char* note) {
  std::strncpy(stop_note, note, sizeof(stop_note) - 1);
  stop_note[sizeof(stop_note) - 1] = '\0';
}

int StopSignals::requested() { return first_signal.load(std::memory_order_relaxed); }

void StopSignals::clear() { first_signal.store(0); }

}  // namespace slipstream
