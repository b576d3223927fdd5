// EventFileWriter: TensorBoard event files, written by hand.
//
// Format (what TensorBoard's reader expects): a sequence of TFRecords, each
//   uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
// little-endian, where data is a serialized tensorflow.Event protobuf. The
// first event holds file_version = "brain.Event:2"; each later one holds a
// Summary of scalar values {tag, simple_value}. The file is named
// events.out.tfevents.<seconds>.<host>.<pid>.<n> inside `dir`, with <seconds>
// past those of every event file already there, so that a later start of a
// run sorts after the earlier ones (readers load them in name order). Each
// event is
// written with one fwrite and flushed, so a crash loses at most the event
// being written (TensorBoard ignores a truncated last record).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace slipstream {

class EventFileWriter {
 public:
  // Creates `dir` (and parents) if needed, then the event file in it.
  explicit EventFileWriter(const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  void add_scalars(int64_t step, double wall_time,
                   const std::vector<std::pair<std::string, float>>& values);
  // A SessionLog START at `step`: TensorBoard's reader then drops the events
  // of earlier files at or after that step (a resumed run supersedes them).
  void add_session_start(int64_t step, double wall_time);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event_bytes);
  std::string path_;
  std::FILE* file_ = nullptr;
};

// One decoded event, for tests and tools.
struct TensorBoardEvent {
  double wall_time = 0.0;
  int64_t step = 0;
  std::string file_version;
  bool session_start = false;
  std::vector<std::pair<std::string, float>> scalars;
};

// Reads every record of an event file, checking both CRCs of each; throws
// c10::Error naming the file and the record's offset on any corruption.
std::vector<TensorBoardEvent> read_event_file(const std::string& path);

// Serialization helpers, exposed for tests.
std::string encode_scalar_event(int64_t step, double wall_time,
                                const std::vector<std::pair<std::string, float>>& values);
std::string encode_file_version_event(double wall_time);
std::string encode_session_start_event(int64_t step, double wall_time);
std::string frame_tfrecord(const std::string& data);

}  // namespace slipstream
