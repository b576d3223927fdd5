#include "core/sinks/metrics_logger.h"

#include <nlohmann/json.hpp>

#include <exception>
#include <iostream>
#include <utility>

namespace slipstream {

void MetricsLogger::add_sink(std::unique_ptr<Sink> sink) {
  sinks_.push_back(Slot{std::move(sink), 0});
}

template <class F>
void MetricsLogger::each(const char* what, F&& f) {
  for (auto& slot : sinks_) {
    try {
      f(*slot.sink);
    } catch (const std::exception& e) {
      if (slot.failures++ == 0) {
        std::cerr << "slipstream: log sink '" << slot.sink->name() << "' failed on " << what << ": "
                  << e.what() << " (reported once; training continues)\n";
      }
    }
  }
}

void MetricsLogger::write(const LogRecord& record) {
  each(record.kind.c_str(), [&](Sink& s) { s.write(record); });
}

void MetricsLogger::write_document(const std::string& kind, const nlohmann::json& doc) {
  each(kind.c_str(), [&](Sink& s) { s.write_document(kind, doc); });
}

void MetricsLogger::end_epoch(int64_t epoch) {
  each("end of epoch", [&](Sink& s) { s.end_epoch(epoch); });
}

void MetricsLogger::start_session(const std::string& phase, int64_t step) {
  each("start of session", [&](Sink& s) { s.start_session(phase, step); });
}

void MetricsLogger::flush() {
  each("flush", [&](Sink& s) { s.flush(); });
}

std::vector<size_t> MetricsLogger::failure_counts() const {
  std::vector<size_t> out;
  for (const auto& s : sinks_) out.push_back(s.failures);
  return out;
}

}  // namespace slipstream
