#include "core/io/tensordict_memmap.h"

#include "core/io/mapped_file.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace slipstream {
namespace fs = std::filesystem;
namespace {

at::ScalarType parse_torch_dtype(const std::string& name, const std::string& where) {
  static const std::map<std::string, at::ScalarType> kTypes = {
      {"torch.float64", at::kDouble}, {"torch.float32", at::kFloat},
      {"torch.float16", at::kHalf},   {"torch.bfloat16", at::kBFloat16},
      {"torch.int64", at::kLong},     {"torch.int32", at::kInt},
      {"torch.int16", at::kShort},    {"torch.int8", at::kChar},
      {"torch.uint8", at::kByte},     {"torch.bool", at::kBool},
  };
  auto it = kTypes.find(name);
  TORCH_CHECK(it != kTypes.end(), where, ": unsupported dtype '", name, "'");
  return it->second;
}

nlohmann::json read_meta(const std::string& dir) {
  const std::string path = dir + "/meta.json";
  std::ifstream in(path);
  TORCH_CHECK(in.good(), "tensordict: '", path,
              "' is missing: not a memory-mapped TensorDict directory");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(text.str());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "tensordict: '", path, "' is not valid JSON: ", e.what());
  }
  TORCH_CHECK(meta.is_object(), "tensordict: '", path, "' is not a JSON object");
  return meta;
}

std::string type_of(const nlohmann::json& meta) {
  auto it = meta.find("_type");
  return it != meta.end() && it->is_string() ? it->get<std::string>() : "";
}

MemmapTree read_level(const std::string& dir, const std::string& shown_dir);

// A TensorDict level: `dir` holds meta.json with the entries and the files.
void read_tensordict_level(const std::string& dir, const nlohmann::json& meta, MemmapTree& out) {
  const std::string meta_path = dir + "/meta.json";
  if (meta.contains("shape")) {
    TORCH_CHECK(meta["shape"].is_array(), "tensordict: '", meta_path, "' has a non-list shape");
    for (const auto& d : meta["shape"]) out.batch_shape.push_back(d.get<int64_t>());
  }
  for (const auto& [key, entry] : meta.items()) {
    if (!entry.is_object()) continue;  // shape, device, _type
    std::string where = "tensordict: '";
    where.append(meta_path).append("' key '").append(key).append("'");
    const std::string file_key = memmap_file_key(key);
    if (entry.contains("type")) {
      const std::string child = (fs::path(dir) / file_key).string();
      out.children.emplace(key, read_level(child, child));
      continue;
    }
    TORCH_CHECK(entry.contains("dtype") && entry.contains("shape"), where,
                ": an entry needs a dtype and a shape (or a type)");
    TORCH_CHECK(!entry.value("is_nested", false), where,
                ": nested (jagged) tensors are not supported");
    const at::ScalarType dtype = parse_torch_dtype(entry["dtype"].get<std::string>(), where);
    std::vector<int64_t> shape;
    int64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      const int64_t n = d.get<int64_t>();
      TORCH_CHECK(n >= 0, where, ": negative dimension in its shape");
      shape.push_back(n);
      numel *= n;
    }
    const std::string file = (fs::path(dir) / (file_key + ".memmap")).string();
    if (!fs::exists(file)) {
      TORCH_CHECK(numel == 0, "tensordict: '", file, "' (key '", key, "' of '", meta_path,
                  "') is missing");
      out.tensors.emplace(key, at::empty(shape, at::TensorOptions().dtype(dtype)));
      continue;
    }
    const auto mapped = map_file(file);
    const size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
    TORCH_CHECK(mapped->size() == nbytes, "tensordict: '", file, "' (key '", key, "') holds ",
                mapped->size(), " bytes, but its shape and dtype in meta.json need ", nbytes,
                mapped->size() < nbytes ? " (truncated?)" : "");
    out.tensors.emplace(key, view_tensor(mapped, 0, shape, dtype));
  }
}

MemmapTree read_level(const std::string& dir, const std::string& shown_dir) {
  TORCH_CHECK(fs::is_directory(dir), "tensordict: '", shown_dir, "' is not a directory");
  const nlohmann::json meta = read_meta(dir);
  MemmapTree out;
  out.path = dir;
  out.type = type_of(meta);
  out.non_tensor = nlohmann::json::object();
  const bool tensorclass = !meta.contains("shape") && fs::is_directory(dir + "/_tensordict");
  if (!tensorclass) {
    read_tensordict_level(dir, meta, out);
    return out;
  }
  for (const auto& [key, value] : meta.items()) {
    if (key != "_type") out.non_tensor[key] = value;
  }
  const std::string inner = dir + "/_tensordict";
  read_tensordict_level(inner, read_meta(inner), out);
  return out;
}

}  // namespace

std::string memmap_file_key(const std::string& key) {
  if (key.empty()) return "%";
  if (key == "." || key == "..") return key == "." ? "%2E" : "%2E%2E";
  static const std::string kUnsafe = "/<>:\"|?*\\ %";
  std::string out;
  for (unsigned char c : key) {
    if (c < 32 || c == 127 || c == 0 || kUnsafe.find(static_cast<char>(c)) != std::string::npos) {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

MemmapTree read_tensordict_memmap(const std::string& dir) { return read_level(dir, dir); }

std::string MemmapTree::keys() const {
  std::string out;
  for (const auto& [k, t] : tensors) out += (out.empty() ? "" : ", ") + k;
  for (const auto& [k, c] : children) out += (out.empty() ? "" : ", ") + k + "/";
  return out.empty() ? "nothing" : out;
}

const at::Tensor& MemmapTree::tensor(const std::string& key) const {
  auto it = tensors.find(key);
  TORCH_CHECK(it != tensors.end(), "tensordict: '", path, "' has no tensor '", key,
              "' (it has: ", keys(), ")");
  return it->second;
}

const MemmapTree& MemmapTree::child(const std::string& key) const {
  auto it = children.find(key);
  TORCH_CHECK(it != children.end(), "tensordict: '", path, "' has no '", key, "' (it has: ", keys(),
              ")");
  return it->second;
}

}  // namespace slipstream
