// StopSignals: SIGTERM, SIGINT and SIGHUP (a closed terminal or ssh
// session) as a request to stop cleanly. The first one sets a flag that the
// training loop reads once a step (an atomic load, no system call); the loop
// then finishes its step, drains the readback, checkpoints and exits with
// 128 + the signal (143, 130, 129). A second signal
// exits at once with the same code. Nothing here knows of training.
#pragma once

namespace slipstream {

class StopSignals {
 public:
  // Installs the handlers (idempotent). Call before the first step.
  static void install();
  // What the first signal's message says the process does before it stops
  // (default "finishing the step, then a checkpoint"); copied, at most 200
  // characters. Call before a signal can arrive.
  static void set_stop_note(const char* note);
  // The first signal received since install() or clear(), or 0.
  static int requested();
  // The exit code a stop by `signal` ends the process with: 128 + signal.
  static int exit_code(int signal) { return 128 + signal; }
  // Forgets a request (tests).
  static void clear();
};

}  // namespace slipstream
