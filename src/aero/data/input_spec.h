// InputSpec: which of a sample's named tensors make each model input (the
// recipe's `forward_kwargs`), read from the model config's `inputs:` map:
//
//   inputs:
//     embedding: [points, sdf, sdf_normals]       # point fields, concatenated
//     fx: {source: U_inf, expand_like: embedding}  # a global, on every point
//     global_embedding: U_inf                      # a global alone: (1, 1, C)
//
// A name alone or a list names point fields (each (N, C); concatenated in
// order along channels into (1, N, sum C)) or a single global value (1, 1,
// C). `{source, expand_like}` broadcasts a global to every point of another
// input: (1, N, C). The loader assembles every batch from the spec, so a
// model or dataset with other inputs needs no change to the trainer.
#pragma once

#include "aero/data/sample.h"

#include <yaml-cpp/node/node.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace slipstream::aero {

struct InputSource {
  std::vector<std::string> names;  // concatenated along channels
  std::string expand_like;         // non-empty: broadcast a global to that input's points
};

class InputSpec {
 public:
  InputSpec() = default;
  explicit InputSpec(std::vector<std::pair<std::string, InputSource>> inputs);
  // Parses the `inputs:` map; `key` (e.g. "model.inputs") names it in errors.
  static InputSpec from_yaml(const YAML::Node& node, const std::string& key);

  const std::vector<std::pair<std::string, InputSource>>& inputs() const { return inputs_; }
  std::vector<std::string> names() const;
  bool has(const std::string& input) const;

  // Every sample tensor the spec reads, with its channels, from a layout
  // (which must hold them all): the point fields and globals a run needs.
  SampleLayout required(const SampleLayout& layout) const;
  // The width (last dimension) of each input for samples of this layout.
  std::map<std::string, int64_t> widths(const SampleLayout& layout) const;
  // Builds every input from transformed host tensors: `point` (N, C) and
  // `global` tensors by name. Inputs are (1, N, C) or (1, 1, C), contiguous;
  // inputs with the same sources are the same tensor.
  std::map<std::string, torch::Tensor> assemble(
      const std::map<std::string, torch::Tensor>& point,
      const std::map<std::string, torch::Tensor>& global) const;

 private:
  std::vector<std::pair<std::string, InputSource>> inputs_;
};

}  // namespace slipstream::aero
