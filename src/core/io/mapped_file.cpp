#include "core/io/mapped_file.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace slipstream {

MappedFile::~MappedFile() {
  if (data_ != nullptr && data_ != MAP_FAILED) munmap(data_, size_);
}

std::shared_ptr<const MappedFile> map_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    TORCH_CHECK(false, "cannot stat '", path, "': ", std::strerror(err));
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    file->data_ = mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    if (file->data_ == MAP_FAILED) {
      file->data_ = nullptr;
      TORCH_CHECK(false, "cannot map '", path, "': ", std::strerror(err));
    }
  } else {
    ::close(fd);
  }
  return file;
}

at::Tensor view_tensor(const std::shared_ptr<const MappedFile>& file, size_t offset,
                       const std::vector<int64_t>& shape, at::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype);
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  TORCH_CHECK(offset + nbytes <= file->size(), "'", file->path(), "': ", nbytes,
              " bytes at offset ", offset, " lie past its end (", file->size(), " bytes)");
  if (nbytes == 0) return at::empty(shape, options);
  void* ptr = const_cast<char*>(file->data() + offset);
  if (reinterpret_cast<uintptr_t>(ptr) % c10::elementSize(dtype) != 0) {
    at::Tensor t = at::empty(shape, options);
    std::memcpy(t.data_ptr(), ptr, nbytes);
    return t;
  }
  // The deleter holds the mapping: it lives while any view does.
  return at::from_blob(
      ptr, shape, [file](void*) {}, options);
}

}  // namespace slipstream
