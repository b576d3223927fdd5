// Read-only memory-mapped files and tensors that view them.
//
// map_file() maps a whole file (an empty file maps to no bytes); the
// mapping lives while any MappedFile pointer or any tensor made by
// view_tensor() holds it. view_tensor() returns a CPU tensor over `nbytes`
// at `offset` (copied instead when the address is not aligned for the
// dtype). Errors name the file.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace slipstream {

class MappedFile {
 public:
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const char* data() const { return static_cast<const char*>(data_); }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  friend std::shared_ptr<const MappedFile> map_file(const std::string& path);
  MappedFile() = default;
  void* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Throws c10::Error naming `path` if it cannot be opened or mapped.
std::shared_ptr<const MappedFile> map_file(const std::string& path);

// A tensor of `shape` and `dtype` over the mapping's bytes at `offset`;
// the caller has checked that they lie inside the file.
at::Tensor view_tensor(const std::shared_ptr<const MappedFile>& file, size_t offset,
                       const std::vector<int64_t>& shape, at::ScalarType dtype);

}  // namespace slipstream
