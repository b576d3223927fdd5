// JsonlSink: metrics.jsonl, one JSON object per line in the layout of
// PhysicsNeMo's external-aero recipe: the record type under "phase"
// ("train_step", "val_summary", "config", ...), the fields at the top level
// (the total loss also as "loss/total", as the recipe writes it), and a UTC
// "ts" (ISO 8601, milliseconds). A document's keys go to the top level too.
// Every record is written with one fwrite and flushed before write()
// returns, so a crash leaves at most one partial last line. Non-finite values
// are written as null.
#pragma once

#include "core/sinks/sink.h"

#include <cstdio>
#include <string>

namespace slipstream {

class JsonlSink : public Sink {
 public:
  // Appends to `path` (created if missing).
  explicit JsonlSink(std::string path);
  ~JsonlSink() override;
  std::string name() const override { return "jsonl"; }
  void write(const LogRecord& record) override;
  void write_document(const std::string& kind, const nlohmann::json& doc) override;
  void flush() override;

 private:
  void write_line(const std::string& line);
  std::string path_;
  std::FILE* file_ = nullptr;
};

// Now, as "2026-11-30T13:45:12.123Z".
std::string utc_timestamp();

}  // namespace slipstream
