#include "core/sinks/tensorboard_sink.h"

#include <chrono>

namespace slipstream {

TensorBoardSink::TensorBoardSink(std::string dir) : dir_(std::move(dir)) {}

EventFileWriter& TensorBoardSink::writer_for(const std::string& phase) {
  auto& writer = writers_[phase];
  if (!writer) writer = std::make_unique<EventFileWriter>(dir_ + "/" + phase);
  return *writer;
}

void TensorBoardSink::start_session(const std::string& phase, int64_t step) {
  const double wall =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  writer_for(phase).add_session_start(step, wall);
}

void TensorBoardSink::write(const LogRecord& record) {
  auto* writer = &writer_for(record.phase);
  std::vector<std::pair<std::string, float>> values;
  values.reserve(record.fields.size());
  for (const auto& f : record.fields) {
    std::string tag = tensorboard_tag(record, f);
    if (!tag.empty()) values.emplace_back(std::move(tag), static_cast<float>(f.value));
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  writer->add_scalars(record.tb_step, wall, values);
}

void TensorBoardSink::flush() {
  for (auto& [phase, w] : writers_) w->flush();
}

const EventFileWriter* TensorBoardSink::writer(const std::string& phase) const {
  auto it = writers_.find(phase);
  return it == writers_.end() ? nullptr : it->second.get();
}

}  // namespace slipstream
