// ConsoleSink: the human-readable log, rank 0 only (the caller decides).
//   Epoch 3/8 [12/50] 0:31<1:30 Loss: 0.123456 Step: 0.107s 245.1k pts/s Data: 3% Mem: 12.34GB
// every `every_n` train steps (and an epoch's first and last): the epoch's
// elapsed time and what is left of it at its mean step time (the first step
// left out: it warms up), points a second and the share of the time spent
// waiting for data over the epoch so far (the record's "points" and
// "data_time_s", when it has them), and memory. Validation steps print
// "Validation 3/8 [4/10] Loss: ..." lines the same way. At each epoch's end
// a table of the train and val summaries side by side, headed by the
// epoch's time and an estimate of the run's remaining time. Where the
// stream is a TTY, step lines redraw one progress-bar line instead of
// scrolling.
#pragma once

#include "core/sinks/sink.h"

#include <cstdio>
#include <map>
#include <string>

namespace slipstream {

// "1:02:03" or "2:03" (whole seconds).
std::string format_duration(double seconds);

class ConsoleSink : public Sink {
 public:
  explicit ConsoleSink(std::FILE* out = stdout, int every_n = 1);
  std::string name() const override { return "console"; }
  void write(const LogRecord& record) override;
  void end_epoch(int64_t epoch) override;
  void flush() override;

 private:
  // An epoch's running sums, per phase.
  struct Progress {
    int64_t epoch = -1;
    double first_step = 0, later_steps = 0, data = 0, points = 0;
    int64_t later_count = 0;
  };
  void write_line(const LogRecord& record, const std::string& line);

  std::FILE* out_;
  int every_n_;
  bool tty_;
  bool bar_open_ = false;
  std::map<std::string, Progress> progress_;    // by phase
  std::map<std::string, LogRecord> summaries_;  // by phase, this epoch
  int64_t epochs_ = 0;                          // the run's, from the records
};

}  // namespace slipstream
