// MetricsLogger: fans every record out to its sinks. A sink that throws is
// reported once on stderr (naming the sink and the record) and keeps being
// offered later records; a failing sink never stops training.
#pragma once

#include "core/sinks/sink.h"

#include <memory>
#include <string>
#include <vector>

namespace slipstream {

class MetricsLogger {
 public:
  void add_sink(std::unique_ptr<Sink> sink);
  void write(const LogRecord& record);
  void write_document(const std::string& kind, const nlohmann::json& doc);
  void end_epoch(int64_t epoch);
  void start_session(const std::string& phase, int64_t step);
  void flush();

  size_t sink_count() const { return sinks_.size(); }
  // Failures seen so far for each sink, in the order they were added.
  std::vector<size_t> failure_counts() const;

 private:
  struct Slot {
    std::unique_ptr<Sink> sink;
    size_t failures = 0;
  };
  template <class F>
  void each(const char* what, F&& f);
  std::vector<Slot> sinks_;
};

}  // namespace slipstream
