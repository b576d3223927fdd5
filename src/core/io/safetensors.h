// Safetensors files: read (memory-mapped) and write (atomically).
//
// Format: an 8-byte little-endian header length N, N bytes of JSON mapping
// each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (plus
// an optional "__metadata__" of string values), then the raw little-endian
// tensor bytes, offsets relative to the end of the header.
//
// read_safetensors_index reads the header alone: each tensor's dtype, shape
// and absolute byte range, for readers that take a few rows of a large
// file (RandomAccessFile). read_safetensors maps the file and returns CPU tensors that view the
// mapping (it stays alive while any tensor does). Every malformed or
// truncated file throws c10::Error naming the file and, where it applies,
// the tensor. write_safetensors writes to a temp file then renames, so a
// reader never sees a half-written file.
#pragma once

#include "core/io/random_access_file.h"

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace slipstream {

struct SafetensorsFile {
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // in file order
  std::map<std::string, std::string> metadata;

  // The tensor named `name`; throws naming the file's path and the name.
  const at::Tensor& at(const std::string& name) const;
  bool contains(const std::string& name) const;
  std::string path;
};

SafetensorsFile read_safetensors(const std::string& path);

struct SafetensorsEntry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // of its first byte, from the start of the file
  uint64_t nbytes = 0;
};
struct SafetensorsIndex {
  std::string path;
  std::vector<SafetensorsEntry> entries;  // in file order
  std::map<std::string, std::string> metadata;
  const SafetensorsEntry* find(const std::string& name) const;  // nullptr if absent
  const SafetensorsEntry& at(const std::string& name) const;    // throws naming path and name
};
SafetensorsIndex read_safetensors_index(const RandomAccessFile& file);

// The bytes before the data of a file holding tensors of these names, types
// and shapes, in this order (length, JSON, padding); `offsets`, if given,
// receives each tensor's absolute byte offset. For writers that place the
// data themselves (AtomicFileWriter::write_at).
struct SafetensorsSpec {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};
std::string safetensors_header(const std::vector<SafetensorsSpec>& specs,
                               const std::map<std::string, std::string>& metadata,
                               std::vector<uint64_t>* offsets = nullptr);

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace slipstream
