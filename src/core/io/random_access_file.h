// A file read by byte ranges (pread), for readers that take a few blocks of
// a large file per step: each read is one system call for the whole range,
// so a cold page cache costs one sequential read per range, not a page
// fault per 4 KiB. Errors name the file, the range and the system's reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace slipstream {

class RandomAccessFile {
 public:
  explicit RandomAccessFile(std::string path);
  ~RandomAccessFile();
  RandomAccessFile(const RandomAccessFile&) = delete;
  RandomAccessFile& operator=(const RandomAccessFile&) = delete;

  // Reads exactly `size` bytes at `offset` into `out`; a short file throws.
  void read(uint64_t offset, size_t size, void* out) const;
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Asks the kernel to drop the file's pages from its cache
  // (posix_fadvise DONTNEED), so that the next reads come from the disk.
  void drop_cache() const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

}  // namespace slipstream
