// Memory-mapped TensorDict trees, as tensordict's `memmap()` writes them
// (PhysicsNeMo's Mesh.save / DomainMesh.save: `.pmsh` and `.pdmsh`).
//
// Layout, one directory per level:
//   <dir>/meta.json        a TensorDict level: {"<key>": {"device", "shape",
//                          "dtype": "torch.float32", "is_nested"}, one per
//                          tensor; "<key>": {"type": "TensorDict" | "<class>"}
//                          per nested collection; "shape": batch size,
//                          "device", "_type"}
//   <dir>/<key>.memmap     a tensor's raw bytes (C order, little endian); a
//                          tensor with no elements has no file
//   <dir>/<key>/           a nested collection
// A tensorclass (Mesh, DomainMesh) is a directory whose meta.json holds only
// its "_type" (and JSON-able non-tensor fields) and whose tensors are in
// <dir>/_tensordict/, itself a TensorDict level. Keys are written to file
// names with tensordict's filesystem encoding (%XX for '/', ' ', '%', ...).
//
// read_tensordict_memmap() maps every tensor file (nothing is read until it
// is touched) and checks each against its metadata; every error names the
// file and the key.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace slipstream {

struct MemmapTree {
  std::string path;  // the directory of this level (a tensorclass's, not its _tensordict/)
  std::string type;  // "_type": "<class 'tensordict._td.TensorDict'>", a tensorclass's class
  std::vector<int64_t> batch_shape;
  nlohmann::json non_tensor;  // a tensorclass's non-tensor fields (an object)
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, MemmapTree> children;

  bool has_tensor(const std::string& key) const { return tensors.count(key) > 0; }
  bool has_child(const std::string& key) const { return children.count(key) > 0; }
  // Throw naming this level's directory, the key and the keys it has.
  const at::Tensor& tensor(const std::string& key) const;
  const MemmapTree& child(const std::string& key) const;
  std::string keys() const;  // "a, b, c/" (children with a slash)
};

MemmapTree read_tensordict_memmap(const std::string& dir);

// tensordict's file name for a key.
std::string memmap_file_key(const std::string& key);

}  // namespace slipstream
