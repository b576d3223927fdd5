#include "aero/data/input_spec.h"

#include "core/text/join.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

namespace slipstream::aero {

namespace {

std::vector<std::string> names_of(const YAML::Node& n, const std::string& key) {
  if (n.IsScalar()) return {n.as<std::string>()};
  TORCH_CHECK(n.IsSequence() && n.size() > 0, "config: '", key,
              "' must name a sample tensor or a non-empty list of them");
  std::vector<std::string> out;
  for (const auto& e : n) {
    TORCH_CHECK(e.IsScalar(), "config: '", key, "' lists something that is not a name");
    out.push_back(e.as<std::string>());
  }
  return out;
}

}  // namespace

InputSpec::InputSpec(std::vector<std::pair<std::string, InputSource>> inputs)
    : inputs_(std::move(inputs)) {
  for (const auto& [name, src] : inputs_) {
    TORCH_CHECK(!src.names.empty(), "inputs: '", name, "' names no sample tensor");
    if (!src.expand_like.empty()) {
      TORCH_CHECK(src.names.size() == 1, "inputs: '", name,
                  "' broadcasts one global value; give one source");
      TORCH_CHECK(has(src.expand_like) && src.expand_like != name, "inputs: '", name,
                  "' expands like '", src.expand_like,
                  "', which is not another input (inputs: ", join(names()), ")");
    }
  }
}

InputSpec InputSpec::from_yaml(const YAML::Node& node, const std::string& key) {
  TORCH_CHECK(node && node.IsMap() && node.size() > 0, "config: '", key,
              "' must map each model input to sample tensors (e.g. embedding: [points, sdf])");
  std::vector<std::pair<std::string, InputSource>> inputs;
  for (const auto& kv : node) {
    const std::string name = kv.first.as<std::string>();
    const std::string sub = key + "." + name;
    InputSource src;
    if (kv.second.IsMap()) {
      for (const auto& f : kv.second) {
        const auto k = f.first.as<std::string>();
        TORCH_CHECK(k == "source" || k == "expand_like", "config: unknown key '", sub, ".", k,
                    "' (an input takes 'source' and 'expand_like')");
      }
      TORCH_CHECK(kv.second["source"], "config: '", sub, "' needs 'source'");
      src.names = names_of(kv.second["source"], sub + ".source");
      if (kv.second["expand_like"]) src.expand_like = kv.second["expand_like"].as<std::string>();
    } else {
      src.names = names_of(kv.second, sub);
    }
    inputs.emplace_back(name, std::move(src));
  }
  return InputSpec(std::move(inputs));
}

std::vector<std::string> InputSpec::names() const {
  std::vector<std::string> out;
  for (const auto& [name, src] : inputs_) out.push_back(name);
  return out;
}

bool InputSpec::has(const std::string& input) const {
  for (const auto& [name, src] : inputs_) {
    if (name == input) return true;
  }
  return false;
}

SampleLayout InputSpec::required(const SampleLayout& layout) const {
  SampleLayout out;
  for (const auto& [name, src] : inputs_) {
    const bool global_source = src.names.size() == 1 && layout.global_sizes.count(src.names[0]) &&
                               !layout.point_channels.count(src.names[0]);
    for (const auto& t : src.names) {
      if (global_source || !src.expand_like.empty()) {
        auto it = layout.global_sizes.find(t);
        TORCH_CHECK(it != layout.global_sizes.end(), "inputs: '", name, "' reads global '", t,
                    "', which the dataset's samples do not hold");
        out.global_sizes[t] = it->second;
      } else {
        auto it = layout.point_channels.find(t);
        TORCH_CHECK(it != layout.point_channels.end(), "inputs: '", name, "' reads '", t,
                    "', which the dataset's samples do not hold as a point field");
        out.point_channels[t] = it->second;
      }
    }
  }
  return out;
}

std::map<std::string, int64_t> InputSpec::widths(const SampleLayout& layout) const {
  const SampleLayout req = required(layout);
  std::map<std::string, int64_t> out;
  for (const auto& [name, src] : inputs_) {
    int64_t w = 0;
    for (const auto& t : src.names) {
      auto p = req.point_channels.find(t);
      w += p != req.point_channels.end() ? p->second : req.global_sizes.at(t);
    }
    out[name] = w;
  }
  return out;
}

std::map<std::string, torch::Tensor> InputSpec::assemble(
    const std::map<std::string, torch::Tensor>& point,
    const std::map<std::string, torch::Tensor>& global) const {
  std::map<std::string, torch::Tensor> out;
  // Inputs with the same sources are one tensor (a model may tell them apart
  // by identity, e.g. one neighbour search for geometry and positions).
  std::map<std::vector<std::string>, std::string> by_sources;
  // Point and single-global inputs first, then the broadcasts that need them.
  for (const auto& [name, src] : inputs_) {
    if (!src.expand_like.empty()) continue;
    auto same = by_sources.find(src.names);
    if (same != by_sources.end()) {
      out[name] = out.at(same->second);
      continue;
    }
    by_sources[src.names] = name;
    if (src.names.size() == 1 && !point.count(src.names[0])) {
      auto g = global.find(src.names[0]);
      TORCH_CHECK(g != global.end(), "inputs: '", name, "': no tensor '", src.names[0], "'");
      out[name] = g->second.to(torch::kFloat).reshape({1, 1, -1}).contiguous();
      continue;
    }
    std::vector<torch::Tensor> parts;
    for (const auto& t : src.names) {
      auto p = point.find(t);
      TORCH_CHECK(p != point.end(), "inputs: '", name, "': no point field '", t, "'");
      parts.push_back(p->second);
    }
    out[name] = (parts.size() == 1 ? parts[0] : torch::cat(parts, 1)).unsqueeze(0).contiguous();
  }
  for (const auto& [name, src] : inputs_) {
    if (src.expand_like.empty()) continue;
    auto g = global.find(src.names[0]);
    TORCH_CHECK(g != global.end(), "inputs: '", name, "': no global '", src.names[0], "'");
    const int64_t n = out.at(src.expand_like).size(1);
    const auto& like = out.at(src.expand_like);
    out[name] =
        g->second.to(like.scalar_type()).reshape({1, 1, -1}).expand({1, n, -1}).contiguous();
  }
  return out;
}

}  // namespace slipstream::aero
