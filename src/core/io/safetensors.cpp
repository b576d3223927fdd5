#include "core/io/safetensors.h"

#include "core/io/atomic_file.h"
#include "core/io/mapped_file.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

namespace slipstream {
namespace {

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeInfo kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool},
};

at::ScalarType parse_dtype(const std::string& name, const std::string& where) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.type;
  }
  TORCH_CHECK(false, where, ": unsupported dtype '", name, "'");
}

const char* dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes) {
    if (t == d.type) return d.name;
  }
  TORCH_CHECK(false, "safetensors: cannot write dtype ", t);
}

}  // namespace

const at::Tensor& SafetensorsFile::at(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  TORCH_CHECK(false, "safetensors: '", path, "' has no tensor '", name, "'");
}

bool SafetensorsFile::contains(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return true;
  }
  return false;
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::shared_ptr<const MappedFile> mapping;
  try {
    mapping = map_file(path);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "safetensors: ", e.what_without_backtrace());
  }
  const size_t file_size = mapping->size();
  TORCH_CHECK(file_size >= 8, "safetensors: '", path, "' is truncated (", file_size,
              " bytes, shorter than the 8-byte header length)");
  const char* bytes = mapping->data();
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);
  TORCH_CHECK(header_len <= file_size - 8, "safetensors: '", path,
              "' is truncated: its header claims ", header_len, " bytes but the file has ",
              file_size - 8, " after the length");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "safetensors: '", path, "' has a malformed JSON header: ", e.what());
  }
  TORCH_CHECK(header.is_object(), "safetensors: '", path, "' header is not a JSON object");
  const size_t data_begin = 8 + header_len;
  const size_t data_size = file_size - data_begin;

  SafetensorsFile out;
  out.path = path;
  std::vector<std::pair<size_t, std::string>> order;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        out.metadata[m.key()] =
            m.value().is_string() ? m.value().get<std::string>() : m.value().dump();
      }
      continue;
    }
    const std::string where = "safetensors: '" + path + "' tensor '" + it.key() + "'";
    const auto& entry = it.value();
    TORCH_CHECK(
        entry.contains("dtype") && entry.contains("shape") && entry.contains("data_offsets"), where,
        ": entry needs dtype, shape and data_offsets");
    const at::ScalarType dtype = parse_dtype(entry["dtype"].get<std::string>(), where);
    std::vector<int64_t> shape = entry["shape"].get<std::vector<int64_t>>();
    const auto offsets = entry["data_offsets"].get<std::vector<uint64_t>>();
    TORCH_CHECK(offsets.size() == 2 && offsets[0] <= offsets[1], where, ": bad data_offsets");
    TORCH_CHECK(offsets[1] <= data_size, where, ": data ends at byte ", offsets[1],
                " but the file holds ", data_size, " data bytes (truncated file?)");
    int64_t numel = 1;
    for (int64_t d : shape) {
      TORCH_CHECK(d >= 0, where, ": negative dimension");
      numel *= d;
    }
    const size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
    TORCH_CHECK(nbytes == offsets[1] - offsets[0], where, ": shape and dtype need ", nbytes,
                " bytes, data_offsets span ", offsets[1] - offsets[0]);
    const at::Tensor t = view_tensor(mapping, data_begin + offsets[0], shape, dtype);
    order.emplace_back(offsets[0], it.key());
    out.tensors.emplace_back(it.key(), t);
  }
  // nlohmann's object is sorted by key; restore the file's data order.
  std::vector<std::pair<std::string, at::Tensor>> sorted;
  sorted.reserve(order.size());
  std::vector<size_t> idx(order.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(),
                   [&](size_t a, size_t b) { return order[a].first < order[b].first; });
  for (size_t i : idx) sorted.push_back(out.tensors[i]);
  out.tensors = std::move(sorted);
  return out;
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) {
    nlohmann::ordered_json meta;
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  std::vector<at::Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const uint64_t n = c.numel() * c.element_size();
    header[name] = {{"dtype", dtype_name(c.scalar_type())},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
    contiguous.push_back(c);
  }
  std::string head = header.dump();
  while ((8 + head.size()) % 8 != 0) head.push_back(' ');  // align the data
  std::string bytes;
  bytes.reserve(8 + head.size() + offset);
  const uint64_t len = head.size();
  bytes.append(reinterpret_cast<const char*>(&len), 8);
  bytes += head;
  for (const auto& c : contiguous) {
    bytes.append(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
  }
  write_file_atomically(path, bytes);
}

}  // namespace slipstream
