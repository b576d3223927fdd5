#include "core/io/archive.h"

#include <c10/util/Exception.h>

#include <array>
#include <cstring>
#include <iterator>
#include <utility>

namespace slipstream {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50, kCentralHeader = 0x02014b50, kEnd = 0x06054b50;

uint32_t le(const std::string& b, size_t at, int bytes, const std::string& what) {
  TORCH_CHECK(at + bytes <= b.size(), "'", what, "': truncated archive (a header at byte ", at,
              " runs past its end, ", b.size(), " bytes)");
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
  return v;
}

void put(std::string& out, uint32_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::map<std::string, std::string> read_zip(const std::string& b, const std::string& what) {
  // The end-of-central-directory record: 22 bytes plus a comment of up to 64 KiB.
  TORCH_CHECK(b.size() >= 22, "'", what, "': truncated archive (", b.size(), " bytes)");
  size_t end = std::string::npos;
  const size_t lowest = b.size() > 22 + 65535 ? b.size() - 22 - 65535 : 0;
  for (size_t at = b.size() - 22;; --at) {
    if (le(b, at, 4, what) == kEnd) {
      end = at;
      break;
    }
    if (at == lowest) break;
  }
  TORCH_CHECK(end != std::string::npos, "'", what,
              "': truncated or not a zip archive (no end-of-central-directory record)");
  const uint32_t count = le(b, end + 10, 2, what), dir_at = le(b, end + 16, 4, what);
  TORCH_CHECK(count != 0xffff && dir_at != 0xffffffff, "'", what,
              "': a zip64 archive, which is not supported");
  std::map<std::string, std::string> out;
  // Each entry's bytes (local header to data end), by start: entries may not
  // share bytes, so that what is copied out is at most the file's size
  // (thousands of directory entries over one large entry would copy it
  // thousands of times).
  std::map<size_t, std::pair<size_t, std::string>> spans;
  size_t at = dir_at;
  for (uint32_t i = 0; i < count; ++i) {
    TORCH_CHECK(le(b, at, 4, what) == kCentralHeader, "'", what,
                "': damaged central directory (entry ", i, ")");
    const uint32_t method = le(b, at + 10, 2, what), crc = le(b, at + 16, 4, what);
    const uint32_t size = le(b, at + 20, 4, what), stored = le(b, at + 24, 4, what);
    const uint32_t name_len = le(b, at + 28, 2, what), extra_len = le(b, at + 30, 2, what);
    const uint32_t comment_len = le(b, at + 32, 2, what), local = le(b, at + 42, 4, what);
    TORCH_CHECK(at + 46 + name_len <= b.size(), "'", what, "': truncated archive");
    const std::string name = b.substr(at + 46, name_len);
    TORCH_CHECK(method == 0, "'", what, "': entry '", name, "' is compressed (method ", method,
                "); only stored entries are read");
    TORCH_CHECK(size == stored && size != 0xffffffff, "'", what, "': entry '", name,
                "' has inconsistent sizes");
    TORCH_CHECK(le(b, local, 4, what) == kLocalHeader, "'", what, "': entry '", name,
                "' has no local header at byte ", local);
    const size_t data = local + 30 + le(b, local + 26, 2, what) + le(b, local + 28, 2, what);
    TORCH_CHECK(data + size <= b.size(), "'", what, "': truncated archive (entry '", name,
                "' needs bytes up to ", data + size, ", the file has ", b.size(), ")");
    TORCH_CHECK(!out.count(name), "'", what, "': entry '", name, "' appears twice");
    auto next = spans.lower_bound(local);
    const bool overlaps_next = next != spans.end() && next->first < data + size;
    const bool overlaps_previous =
        next != spans.begin() && std::prev(next)->second.first > static_cast<size_t>(local);
    TORCH_CHECK(!overlaps_next && !overlaps_previous, "'", what, "': entry '", name,
                "' shares its bytes with entry '",
                overlaps_next ? next->second.second : std::prev(next)->second.second,
                "' (a damaged or crafted archive)");
    spans.emplace(local, std::make_pair(data + size, name));
    std::string bytes = b.substr(data, size);
    TORCH_CHECK(crc32_ieee(bytes.data(), bytes.size()) == crc, "'", what, "': entry '", name,
                "' is damaged (CRC-32 mismatch)");
    out[name] = std::move(bytes);
    at += 46 + name_len + extra_len + comment_len;
  }
  return out;
}

uint64_t octal(const std::string& b, size_t at, size_t len) {
  uint64_t v = 0;
  for (size_t i = at; i < at + len && b[i] != '\0' && b[i] != ' '; ++i) {
    if (b[i] < '0' || b[i] > '7') return UINT64_MAX;
    v = v * 8 + static_cast<uint64_t>(b[i] - '0');
  }
  return v;
}

std::map<std::string, std::string> read_tar(const std::string& b, const std::string& what) {
  std::map<std::string, std::string> out;
  std::string long_name;
  for (size_t at = 0; at + 512 <= b.size();) {
    if (b.compare(at, 512, std::string(512, '\0')) == 0) return out;  // the end blocks
    const uint64_t size = octal(b, at + 124, 12);
    TORCH_CHECK(size != UINT64_MAX, "'", what, "': damaged tar header at byte ", at);
    const char type = b[at + 156];
    std::string name = b.substr(at, 100).c_str();
    if (b.compare(at + 257, 5, "ustar") == 0) {
      const std::string prefix = b.substr(at + 345, 155).c_str();
      if (!prefix.empty()) name = std::string(prefix).append("/").append(name);
    }
    if (!long_name.empty()) name = std::move(long_name), long_name.clear();
    const size_t data = at + 512;
    TORCH_CHECK(data + size <= b.size(), "'", what, "': truncated archive (entry '", name,
                "' needs bytes up to ", data + size, ", the file has ", b.size(), ")");
    if (type == 'L') {  // GNU long name: the next header's name
      long_name = b.substr(data, size).c_str();
    } else if (type == '0' || type == '\0') {
      if (name.rfind("./", 0) == 0) name = name.substr(2);
      out[name] = b.substr(data, size);
    }
    at = data + (size + 511) / 512 * 512;
  }
  TORCH_CHECK(false, "'", what, "': truncated tar archive (no end blocks)");
  return out;  // not reached
}

}  // namespace

uint32_t crc32_ieee(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xffffffffu;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

std::map<std::string, std::string> read_archive(const std::string& bytes, const std::string& what) {
  if (bytes.size() >= 4 && bytes.compare(0, 4, "PK\x03\x04") == 0) return read_zip(bytes, what);
  if (bytes.size() >= 512 && (bytes.compare(257, 5, "ustar") == 0)) return read_tar(bytes, what);
  TORCH_CHECK(!bytes.empty(), "'", what, "' is empty");
  TORCH_CHECK(false, "'", what, "' is neither a zip nor a tar archive");
  return {};  // not reached
}

std::string write_zip(const std::vector<std::pair<std::string, std::string>>& entries,
                      int64_t alignment) {
  TORCH_CHECK(alignment >= 1, "write_zip: alignment must be >= 1");
  std::string out, dir;
  for (const auto& entry : entries) {
    const std::string& name = entry.first;
    const std::string& data = entry.second;
    TORCH_CHECK(name.size() < 0xffff, "write_zip: entry name too long: ", name);
    const size_t offset = out.size();
    const uint32_t crc = crc32_ieee(data.data(), data.size());
    // Pad with an extra field so that the data starts on `alignment`.
    const size_t unpadded = offset + 30 + name.size();
    size_t pad = (alignment - unpadded % alignment) % alignment;
    if (pad != 0 && pad < 4) pad += alignment;  // an extra field needs 4 header bytes
    auto header = [&](std::string& s, bool central) {
      put(s, central ? kCentralHeader : kLocalHeader, 4);
      if (central) put(s, 20, 2);  // version made by
      put(s, 20, 2);               // version needed
      put(s, 0, 2);                // flags
      put(s, 0, 2);                // method: stored
      put(s, 0, 2);                // time
      put(s, 0x21, 2);             // date: 1980-01-01
      put(s, crc, 4);
      put(s, static_cast<uint32_t>(data.size()), 4);
      put(s, static_cast<uint32_t>(data.size()), 4);
      put(s, static_cast<uint32_t>(name.size()), 2);
      put(s, central ? 0 : static_cast<uint32_t>(pad), 2);
      if (central) {
        put(s, 0, 2);  // comment
        put(s, 0, 2);  // disk
        put(s, 0, 2);  // internal attributes
        put(s, 0, 4);  // external attributes
        put(s, static_cast<uint32_t>(offset), 4);
      }
      s += name;
    };
    header(out, false);
    if (pad != 0) {
      put(out, 0x4246, 2);  // "FB", as torch.save names its padding
      put(out, static_cast<uint32_t>(pad - 4), 2);
      out.append(pad - 4, 'Z');
    }
    out += data;
    TORCH_CHECK(out.size() < 0xffffffffull, "write_zip: archive over 4 GiB (zip64 not written)");
    header(dir, true);
  }
  const size_t dir_at = out.size();
  out += dir;
  put(out, kEnd, 4);
  put(out, 0, 2);
  put(out, 0, 2);
  put(out, static_cast<uint32_t>(entries.size()), 2);
  put(out, static_cast<uint32_t>(entries.size()), 2);
  put(out, static_cast<uint32_t>(dir.size()), 4);
  put(out, static_cast<uint32_t>(dir_at), 4);
  put(out, 0, 2);
  return out;
}

}  // namespace slipstream
