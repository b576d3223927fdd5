// TensorBoardSink: one event file per phase under <dir>/<phase>/ (tb/train,
// tb/val), each record one event whose scalars are tagged by tensorboard_tag().
#pragma once

#include "core/sinks/event_file_writer.h"
#include "core/sinks/sink.h"

#include <map>
#include <memory>
#include <string>

namespace slipstream {

class TensorBoardSink : public Sink {
 public:
  explicit TensorBoardSink(std::string dir);
  std::string name() const override { return "tensorboard"; }
  void write(const LogRecord& record) override;
  void start_session(const std::string& phase, int64_t step) override;
  void flush() override;
  // The writer of a phase, or null if that phase has written nothing yet.
  const EventFileWriter* writer(const std::string& phase) const;

 private:
  EventFileWriter& writer_for(const std::string& phase);
  std::string dir_;
  std::map<std::string, std::unique_ptr<EventFileWriter>> writers_;
};

}  // namespace slipstream
