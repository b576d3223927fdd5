// A progress bar for long reads and loops, on stderr.
//
// On a terminal it redraws one line ("label [#####     ]  52%  12.3 s") at
// most 10 times a second; elsewhere (a log file, CI) it prints a plain line
// at 25 %, 50 %, 75 % and 100 %, and only for work that has run at least
// `quiet_s` seconds, so short reads add nothing to logs. Thread-compatible:
// one owner calls update().
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace slipstream {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label, double quiet_s = 2.0, std::FILE* out = stderr);
  ~ProgressBar();  // finishes the line if update() drew one
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // `fraction` of the work done, in [0, 1].
  void update(double fraction);
  void finish() { update(1.0); }

 private:
  double elapsed() const;
  std::string label_;
  double quiet_s_;
  std::FILE* out_;
  bool tty_;
  bool drawn_ = false, finished_ = false;
  int next_quarter_ = 1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace slipstream
