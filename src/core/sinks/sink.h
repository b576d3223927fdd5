// Sink: where log records go. Sinks are driven from the training thread by a
// MetricsLogger; they may throw on failure (the logger reports it once and
// training goes on). write() must leave the record durable enough that a
// crash right after loses at most the record being written.
#pragma once

#include "core/sinks/log_record.h"

#include <nlohmann/json_fwd.hpp>

#include <string>

namespace slipstream {

class Sink {
 public:
  virtual ~Sink() = default;
  virtual std::string name() const = 0;
  virtual void write(const LogRecord& record) = 0;
  // A free-form document (the resolved config, the dataset's description).
  virtual void write_document(const std::string& kind, const nlohmann::json& doc) {}
  // The epoch's records have all been written.
  virtual void end_epoch(int64_t epoch) {}
  // A new session of the run (a resume) starts at `step` of `phase`
  // ("train", "val"): what earlier sessions logged at or after it is
  // superseded.
  virtual void start_session(const std::string& phase, int64_t step) {}
  virtual void flush() {}
};

}  // namespace slipstream
