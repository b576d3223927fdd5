// State dicts in torch.save's format, read and written without Python:
// a zip (archive.h) of `<name>/data.pkl` — a protocol-2 pickle of an
// OrderedDict of tensors, each rebuilt by torch._utils._rebuild_tensor_v2
// from a persistent storage id — and `<name>/data/<key>`, each storage's
// raw little-endian bytes. What Python's `torch.save(model.state_dict())`
// writes, PhysicsNeMo's `model.pt` included, and what `torch.load` (also
// with weights_only=True) reads back.
//
// The reader runs a small pickle machine that knows the opcodes and the
// globals of a state dict; any other global (a pickled class, a function)
// is an error naming it, never code run. Tensors come back contiguous on
// the CPU.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace slipstream {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// `bytes`: the torch.save file's contents; `what` names it in errors.
NamedTensors read_torch_state_dict(const std::string& bytes, const std::string& what);

// The torch.save file's bytes (`archive` is the zip's top folder, as
// torch.save names it after the file).
std::string write_torch_state_dict(const NamedTensors& tensors,
                                   const std::string& archive = "archive");

}  // namespace slipstream
