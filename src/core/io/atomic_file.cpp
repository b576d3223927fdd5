#include "core/io/atomic_file.h"

#include <c10/util/Exception.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace slipstream {

AtomicFileWriter::AtomicFileWriter(std::string path)
    // Unique per process: two writers of one path never share a temp file.
    : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(getpid())) {
  file_ = std::fopen(tmp_.c_str(), "wb");
  TORCH_CHECK(file_ != nullptr, "cannot create '", tmp_, "': ", std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(tmp_.c_str());
  }
}

void AtomicFileWriter::fail(const std::string& what, int err) {
  if (file_ != nullptr) std::fclose(file_);
  file_ = nullptr;
  std::remove(tmp_.c_str());
  TORCH_CHECK(false, what, " '", tmp_, "' failed: ", std::strerror(err));
}

void AtomicFileWriter::write(const void* data, size_t size) {
  TORCH_CHECK(file_ != nullptr, "writing '", path_, "' after it was committed");
  if (size > 0 && std::fwrite(data, 1, size, file_) != size) fail("writing", errno);
}

void AtomicFileWriter::write_at(uint64_t offset, const void* data, size_t size) {
  TORCH_CHECK(file_ != nullptr, "writing '", path_, "' after it was committed");
  if (std::fflush(file_) != 0) fail("writing", errno);
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = pwrite(fileno(file_), p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing", n < 0 ? errno : EIO);
    p += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  TORCH_CHECK(file_ != nullptr, "'", path_, "' was committed twice");
  if (std::fflush(file_) != 0 || fsync(fileno(file_)) != 0) fail("flushing", errno);
  if (std::fclose(file_) != 0) {
    file_ = nullptr;
    const int err = errno;
    std::remove(tmp_.c_str());
    TORCH_CHECK(false, "closing '", tmp_, "' failed: ", std::strerror(err));
  }
  file_ = nullptr;
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  if (ec) {
    std::remove(tmp_.c_str());
    TORCH_CHECK(false, "cannot rename '", tmp_, "' to '", path_, "': ", ec.message());
  }
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  AtomicFileWriter w(path);
  w.write(bytes.data(), bytes.size());
  w.commit();
}

}  // namespace slipstream
