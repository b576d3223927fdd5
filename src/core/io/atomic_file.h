// Files that appear whole under their name or not at all.
//
// AtomicFileWriter streams bytes to "<path>.tmp.<pid>"; commit() flushes,
// fsyncs and renames it over `path`. A writer destroyed without commit()
// (an exception on the way) removes its temp file. Every failure throws a
// c10::Error naming the file and the system's reason (ENOSPC: "No space
// left on device") and leaves no temp file behind.
// write_file_atomically: the same for bytes already in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace slipstream {

class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t size);
  // Writes at a byte offset of the file (a later part may come first; the
  // file is as long as its furthest write). Sequential write()s continue
  // from where they left off.
  void write_at(uint64_t offset, const void* data, size_t size);
  void commit();
  const std::string& path() const { return path_; }

 private:
  void fail(const std::string& what, int err);
  std::string path_, tmp_;
  std::FILE* file_ = nullptr;
};

void write_file_atomically(const std::string& path, const std::string& bytes);

}  // namespace slipstream
