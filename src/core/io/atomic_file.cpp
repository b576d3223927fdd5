#include "core/io/atomic_file.h"

#include <c10/util/Exception.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace slipstream {

void write_file_atomically(const std::string& path, const std::string& bytes) {
  // Unique per process: two writers of one path never share a temp file.
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  TORCH_CHECK(f != nullptr, "cannot create '", tmp, "': ", std::strerror(errno));
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() &&
                  std::fflush(f) == 0 && fsync(fileno(f)) == 0;
  const int err = errno;
  std::fclose(f);
  if (!ok) {
    std::remove(tmp.c_str());
    TORCH_CHECK(false, "writing '", tmp, "' failed: ", std::strerror(err));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    TORCH_CHECK(false, "cannot rename '", tmp, "' to '", path, "': ", ec.message());
  }
}

}  // namespace slipstream
