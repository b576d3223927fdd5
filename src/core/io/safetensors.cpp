#include "core/io/safetensors.h"

#include "core/io/atomic_file.h"
#include "core/io/mapped_file.h"
#include "core/io/random_access_file.h"

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

namespace {

// The entries of a header (`json` bytes) of a file of `file_size` bytes.
SafetensorsIndex parse_header(const std::string& path, const char* json, uint64_t header_len,
                              uint64_t file_size) {
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(json, json + header_len);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "safetensors: '", path, "' has a malformed JSON header: ", e.what());
  }
  TORCH_CHECK(header.is_object(), "safetensors: '", path, "' header is not a JSON object");
  const uint64_t data_begin = 8 + header_len;
  const uint64_t data_size = file_size - data_begin;
  SafetensorsIndex out;
  out.path = path;
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
    SafetensorsEntry e;
    e.name = it.key();
    e.dtype = parse_dtype(entry["dtype"].get<std::string>(), where);
    e.shape = entry["shape"].get<std::vector<int64_t>>();
    const auto offsets = entry["data_offsets"].get<std::vector<uint64_t>>();
    TORCH_CHECK(offsets.size() == 2 && offsets[0] <= offsets[1], where, ": bad data_offsets");
    TORCH_CHECK(offsets[1] <= data_size, where, ": data ends at byte ", offsets[1],
                " but the file holds ", data_size, " data bytes (truncated file?)");
    int64_t numel = 1;
    for (int64_t d : e.shape) {
      TORCH_CHECK(d >= 0, where, ": negative dimension");
      numel *= d;
    }
    e.nbytes = static_cast<uint64_t>(numel) * c10::elementSize(e.dtype);
    TORCH_CHECK(e.nbytes == offsets[1] - offsets[0], where, ": shape and dtype need ", e.nbytes,
                " bytes, data_offsets span ", offsets[1] - offsets[0]);
    e.offset = data_begin + offsets[0];
    out.entries.push_back(std::move(e));
  }
  // nlohmann's object is sorted by key; restore the file's data order.
  std::stable_sort(
      out.entries.begin(), out.entries.end(),
      [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.offset < b.offset; });
  return out;
}

void check_header_length(const std::string& path, uint64_t header_len, uint64_t file_size) {
  TORCH_CHECK(header_len <= file_size - 8, "safetensors: '", path,
              "' is truncated: its header claims ", header_len, " bytes but the file has ",
              file_size - 8, " after the length");
}

}  // namespace

const SafetensorsEntry* SafetensorsIndex::find(const std::string& name) const {
  for (const auto& e : entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

const SafetensorsEntry& SafetensorsIndex::at(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  TORCH_CHECK(e != nullptr, "safetensors: '", path, "' has no tensor '", name, "'");
  return *e;
}

SafetensorsIndex read_safetensors_index(const RandomAccessFile& file) {
  const uint64_t file_size = file.size();
  TORCH_CHECK(file_size >= 8, "safetensors: '", file.path(), "' is truncated (", file_size,
              " bytes, shorter than the 8-byte header length)");
  uint64_t header_len = 0;
  file.read(0, 8, &header_len);
  check_header_length(file.path(), header_len, file_size);
  std::string json(header_len, '\0');
  file.read(8, header_len, json.data());
  return parse_header(file.path(), json.data(), header_len, file_size);
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
  check_header_length(path, header_len, file_size);
  const SafetensorsIndex index = parse_header(path, bytes + 8, header_len, file_size);
  SafetensorsFile out;
  out.path = path;
  out.metadata = index.metadata;
  for (const auto& e : index.entries) {
    out.tensors.emplace_back(e.name, view_tensor(mapping, e.offset, e.shape, e.dtype));
  }
  return out;
}

std::string safetensors_header(const std::vector<SafetensorsSpec>& specs,
                               const std::map<std::string, std::string>& metadata,
                               std::vector<uint64_t>* offsets) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) {
    nlohmann::ordered_json meta;
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  std::vector<uint64_t> starts;
  starts.reserve(specs.size());
  for (const auto& spec : specs) {
    uint64_t n = c10::elementSize(spec.dtype);
    for (int64_t d : spec.shape) n *= static_cast<uint64_t>(d);
    header[spec.name] = {{"dtype", dtype_name(spec.dtype)},
                         {"shape", spec.shape},
                         {"data_offsets", {offset, offset + n}}};
    starts.push_back(offset);
    offset += n;
  }
  std::string head = header.dump();
  while ((8 + head.size()) % 8 != 0) head.push_back(' ');  // align the data
  const uint64_t len = head.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &len, 8);
  out += head;
  if (offsets != nullptr) {
    offsets->clear();
    for (uint64_t o : starts) offsets->push_back(out.size() + o);
  }
  return out;
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& [name, t] : tensors) specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  const std::string head = safetensors_header(specs, metadata);
  // Streamed tensor by tensor: no second copy of the file in memory.
  AtomicFileWriter out(path);
  out.write(head.data(), head.size());
  for (const auto& [name, t] : tensors) {
    const at::Tensor c = t.detach().to(at::kCPU).contiguous();
    out.write(c.data_ptr(), c.numel() * c.element_size());
  }
  out.commit();
}

}  // namespace slipstream
