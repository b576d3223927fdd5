#include "core/io/random_access_file.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace slipstream {

RandomAccessFile::RandomAccessFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd_ >= 0, "cannot open '", path_, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    TORCH_CHECK(false, "cannot stat '", path_, "': ", std::strerror(err));
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

RandomAccessFile::~RandomAccessFile() {
  if (fd_ >= 0) ::close(fd_);
}

void RandomAccessFile::read(uint64_t offset, size_t size, void* out) const {
  TORCH_CHECK(offset <= size_ && size <= size_ - offset, "'", path_, "' is truncated: bytes [",
              offset, ", ", offset + size, ") lie past its end (", size_, " bytes)");
  auto* p = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t got = ::pread(fd_, p, size, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    TORCH_CHECK(got > 0, "reading '", path_, "' at byte ", offset,
                " failed: ", got < 0 ? std::strerror(errno) : "unexpected end of file");
    p += got;
    offset += static_cast<uint64_t>(got);
    size -= static_cast<size_t>(got);
  }
}

void RandomAccessFile::drop_cache() const {
  const int rc = ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
  TORCH_CHECK(rc == 0, "posix_fadvise on '", path_, "' failed: ", std::strerror(rc));
}

}  // namespace slipstream
