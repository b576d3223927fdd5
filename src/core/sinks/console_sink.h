// ConsoleSink: the human-readable log, rank 0 only (the caller decides).
//   Epoch 3 [12/50] Loss: 0.123456 Step: 0.107s Mem: 12.34GB
// every `every_n` steps (and the epoch's last); at each epoch's end a table
// of the train and val summaries side by side. Where the stream is a TTY,
// step lines redraw one progress-bar line instead of scrolling.
#pragma once

#include "core/sinks/sink.h"

#include <cstdio>
#include <map>
#include <string>

namespace slipstream {

class ConsoleSink : public Sink {
 public:
  explicit ConsoleSink(std::FILE* out = stdout, int every_n = 1);
  std::string name() const override { return "console"; }
  void write(const LogRecord& record) override;
  void end_epoch(int64_t epoch) override;
  void flush() override;

 private:
  std::FILE* out_;
  int every_n_;
  bool tty_;
  bool bar_open_ = false;
  std::map<std::string, LogRecord> summaries_;  // by phase, this epoch
};

}  // namespace slipstream
