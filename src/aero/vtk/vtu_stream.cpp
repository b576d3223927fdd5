#include "aero/vtk/vtu_stream.h"

#include "core/io/random_access_file.h"

#include <c10/util/Exception.h>

#ifdef SLIPSTREAM_WITH_VTK
#include <vtkDataCompressor.h>
#include <vtkLZ4DataCompressor.h>
#include <vtkLZMADataCompressor.h>
#include <vtkNew.h>
#include <vtkSmartPointer.h>
#include <vtkZLibDataCompressor.h>
#endif

#include <algorithm>
#include <cstring>

namespace slipstream::aero {

// The pieces as one byte stream.
class VtuStream::Bytes {
 public:
  explicit Bytes(const std::vector<std::string>& pieces) {
    uint64_t at = 0;
    for (const auto& p : pieces) {
      files_.push_back(std::make_unique<RandomAccessFile>(p));
      starts_.push_back(at);
      at += files_.back()->size();
    }
    size_ = at;
  }
  uint64_t size() const { return size_; }
  void read(uint64_t offset, size_t n, void* out) const {
    TORCH_CHECK(offset + n <= size_, "vtu: '", files_.front()->path(), "' is truncated: bytes [",
                offset, ", ", offset + n, ") past its end (", size_, ")");
    auto* dst = static_cast<char*>(out);
    while (n > 0) {
      const size_t i = static_cast<size_t>(
          std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin() - 1);
      const uint64_t local = offset - starts_[i];
      const size_t take = static_cast<size_t>(std::min<uint64_t>(n, files_[i]->size() - local));
      files_[i]->read(local, take, dst);
      dst += take;
      offset += take;
      n -= take;
    }
  }

 private:
  std::vector<std::unique_ptr<RandomAccessFile>> files_;
  std::vector<uint64_t> starts_;
  uint64_t size_ = 0;
};

namespace {

size_t type_size(const std::string& type) {
  if (type == "Float32" || type == "Int32" || type == "UInt32") return 4;
  if (type == "Float64" || type == "Int64" || type == "UInt64") return 8;
  if (type == "Int16" || type == "UInt16") return 2;
  if (type == "Int8" || type == "UInt8") return 1;
  return 0;
}

torch::ScalarType torch_type(const std::string& type) {
  if (type == "Float32") return torch::kFloat;
  if (type == "Float64") return torch::kDouble;
  if (type == "Int32") return torch::kInt;
  if (type == "Int64") return torch::kLong;
  if (type == "Int16") return torch::kShort;
  if (type == "Int8") return torch::kChar;
  return torch::kByte;  // UInt8; the other unsigned types are refused before
}

struct Tag {
  std::string name;
  std::map<std::string, std::string> attrs;
  bool closing = false, self_closing = false;
};

// The tag in text[begin, end) ('<' ... '>').
Tag parse_tag(const std::string& text, size_t begin, size_t end) {
  Tag t;
  size_t i = begin + 1;
  if (text[i] == '/') {
    t.closing = true;
    ++i;
  }
  size_t j = i;
  while (j < end && !std::isspace(static_cast<unsigned char>(text[j])) && text[j] != '>' &&
         text[j] != '/')
    ++j;
  t.name = text.substr(i, j - i);
  t.self_closing = end >= 2 && text[end - 2] == '/';
  while (j < end) {
    while (j < end && (std::isspace(static_cast<unsigned char>(text[j])) || text[j] == '/')) ++j;
    const size_t eq = text.find('=', j);
    if (eq == std::string::npos || eq >= end) break;
    std::string key = text.substr(j, eq - j);
    while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
    size_t q = eq + 1;
    while (q < end && std::isspace(static_cast<unsigned char>(text[q]))) ++q;
    if (q >= end || (text[q] != '"' && text[q] != '\'')) break;
    const size_t close = text.find(text[q], q + 1);
    if (close == std::string::npos || close >= end) break;
    t.attrs[key] = text.substr(q + 1, close - q - 1);
    j = close + 1;
  }
  return t;
}

std::string attr(const Tag& t, const std::string& key, const std::string& fallback = "") {
  const auto it = t.attrs.find(key);
  return it == t.attrs.end() ? fallback : it->second;
}

// A non-negative integer attribute; -1 when it is not one.
int64_t number(const Tag& t, const std::string& key, const std::string& fallback) {
  const std::string v = attr(t, key, fallback);
  if (v.empty() || v.size() > 18 || v.find_first_not_of("0123456789") != std::string::npos) {
    return -1;
  }
  return std::stoll(v);
}

class RawCursor final : public VtuStream::Cursor {
 public:
  RawCursor(const VtuStream::Bytes& bytes, uint64_t start, const VtuStream::Array& a, int64_t rows,
            std::string what)
      : bytes_(bytes), at_(start), a_(a), left_(rows), what_(std::move(what)) {}
  torch::Tensor next(int64_t rows) override {
    TORCH_CHECK(rows <= left_, "vtu: ", what_, ": read past its last row");
    auto raw =
        torch::empty({rows, a_.components}, torch::TensorOptions().dtype(torch_type(a_.type)));
    const size_t n = static_cast<size_t>(raw.numel()) * type_size(a_.type);
    bytes_.read(at_, n, raw.data_ptr());
    at_ += n;
    left_ -= rows;
    return raw.to(torch::kFloat);
  }

 private:
  const VtuStream::Bytes& bytes_;
  uint64_t at_;
  VtuStream::Array a_;
  int64_t left_;
  std::string what_;
};

#ifdef SLIPSTREAM_WITH_VTK
// VTK's compressed layout: a header of [blocks, block size, last block's
// size, each block's compressed size], then the compressed blocks.
class CompressedCursor final : public VtuStream::Cursor {
 public:
  CompressedCursor(const VtuStream::Bytes& bytes, uint64_t start, const VtuStream::Array& a,
                   int64_t rows, bool header64, const std::string& compressor, std::string what)
      : bytes_(bytes), a_(a), left_(rows), what_(std::move(what)) {
    if (compressor == "vtkZLibDataCompressor") {
      codec_ = vtkSmartPointer<vtkZLibDataCompressor>::New();
    } else if (compressor == "vtkLZ4DataCompressor") {
      codec_ = vtkSmartPointer<vtkLZ4DataCompressor>::New();
    } else {
      codec_ = vtkSmartPointer<vtkLZMADataCompressor>::New();
    }
    const size_t w = header64 ? 8 : 4;
    auto word = [&](uint64_t at) {
      uint64_t v = 0;
      bytes_.read(at, w, &v);  // little-endian
      return v;
    };
    const uint64_t blocks = word(start);
    block_size_ = word(start + w);
    last_size_ = word(start + 2 * w);
    if (last_size_ == 0) last_size_ = block_size_;
    TORCH_CHECK(blocks < (1ULL << 32) && block_size_ > 0 && block_size_ < (1ULL << 34),
                "vtu: ", what_, ": a malformed compression header (", blocks, " blocks of ",
                block_size_, " bytes)");
    std::vector<uint64_t> sizes(blocks);
    for (uint64_t b = 0; b < blocks; ++b) sizes[b] = word(start + (3 + b) * w);
    uint64_t at = start + (3 + blocks) * w;
    for (uint64_t s : sizes) {
      block_at_.push_back(at);
      block_bytes_.push_back(s);
      at += s;
    }
    const uint64_t total = blocks == 0 ? 0 : (blocks - 1) * block_size_ + last_size_;
    const uint64_t want = static_cast<uint64_t>(rows) * a_.components * type_size(a_.type);
    TORCH_CHECK(total == want, "vtu: ", what_, " holds ", total, " bytes; ", rows, " rows of ",
                a_.components, " ", a_.type, " are ", want);
  }

  torch::Tensor next(int64_t rows) override {
    TORCH_CHECK(rows <= left_, "vtu: ", what_, ": read past its last row");
    auto raw =
        torch::empty({rows, a_.components}, torch::TensorOptions().dtype(torch_type(a_.type)));
    auto* out = static_cast<unsigned char*>(raw.data_ptr());
    size_t need = static_cast<size_t>(raw.numel()) * type_size(a_.type);
    while (need > 0) {
      if (pos_ == plain_.size()) load(next_block_++);
      const size_t take = std::min(need, plain_.size() - pos_);
      std::memcpy(out, plain_.data() + pos_, take);
      out += take;
      pos_ += take;
      need -= take;
    }
    left_ -= rows;
    return raw.to(torch::kFloat);
  }

 private:
  void load(size_t b) {
    TORCH_CHECK(b < block_at_.size(), "vtu: ", what_, ": fewer compressed blocks than rows");
    packed_.resize(block_bytes_[b]);
    bytes_.read(block_at_[b], packed_.size(), packed_.data());
    const size_t size = b + 1 == block_at_.size() ? last_size_ : block_size_;
    plain_.resize(size);
    const size_t got = codec_->Uncompress(packed_.data(), packed_.size(), plain_.data(), size);
    TORCH_CHECK(got == size, "vtu: ", what_, ": compressed block ", b,
                " does not uncompress (damaged file?)");
    pos_ = 0;
  }

  const VtuStream::Bytes& bytes_;
  VtuStream::Array a_;
  int64_t left_;
  std::string what_;
  vtkSmartPointer<vtkDataCompressor> codec_;
  uint64_t block_size_ = 0, last_size_ = 0;
  std::vector<uint64_t> block_at_, block_bytes_;
  std::vector<unsigned char> packed_, plain_;
  size_t pos_ = 0, next_block_ = 0;
};

#endif  // SLIPSTREAM_WITH_VTK

}  // namespace

VtuStream::VtuStream(std::vector<std::string> pieces) {
  TORCH_CHECK(!pieces.empty(), "vtu: no file given");
  what_ = pieces.front() +
          (pieces.size() > 1 ? " (+" + std::to_string(pieces.size() - 1) + " pieces)" : "");
  bytes_ = std::make_unique<Bytes>(pieces);
  // The XML before the appended data: read in growing blocks until its '_'.
  std::string head;
  size_t appended = std::string::npos, underscore = std::string::npos;
  for (uint64_t want = 1 << 16;; want *= 4) {
    const uint64_t n = std::min<uint64_t>(want, bytes_->size());
    head.resize(n);
    bytes_->read(0, n, head.data());
    appended = head.find("<AppendedData");
    if (appended != std::string::npos) {
      const size_t close = head.find('>', appended);
      if (close != std::string::npos) underscore = head.find('_', close);
    }
    if (underscore != std::string::npos || n == bytes_->size() || n >= (1ULL << 28)) break;
  }
  const auto refuse = [&](const std::string& why) {
    if (unsupported_.empty()) unsupported_ = why;
  };
  if (underscore == std::string::npos) {
    refuse("its arrays are not in a raw appended section");
    return;
  }
  data_start_ = underscore + 1;
  std::vector<std::string> open;  // the elements we are inside
  int pieces_seen = 0;
  for (size_t i = head.find('<'); i != std::string::npos && i <= appended;
       i = head.find('<', i + 1)) {
    if (head.compare(i, 2, "<?") == 0 || head.compare(i, 2, "<!") == 0) continue;
    const size_t end = head.find('>', i);
    if (end == std::string::npos) break;
    const Tag t = parse_tag(head, i, end + 1);
    i = end;
    if (t.closing) {
      if (!open.empty()) open.pop_back();
      continue;
    }
    if (t.name == "VTKFile") {
      if (attr(t, "type") != "UnstructuredGrid") refuse("it is not an UnstructuredGrid");
      if (attr(t, "byte_order", "LittleEndian") != "LittleEndian") refuse("it is big-endian");
      header64_ = attr(t, "header_type", "UInt32") == "UInt64";
      compressor_ = attr(t, "compressor");
      if (!compressor_.empty() && compressor_ != "vtkZLibDataCompressor" &&
          compressor_ != "vtkLZ4DataCompressor" && compressor_ != "vtkLZMADataCompressor") {
        refuse("its compressor '" + compressor_ + "' is not VTK's zlib, LZ4 or LZMA");
      }
#ifndef SLIPSTREAM_WITH_VTK
      if (!compressor_.empty()) {
        refuse("it is compressed (" + compressor_ + ") and this build has no VTK to uncompress it");
      }
#endif
    } else if (t.name == "AppendedData") {
      if (attr(t, "encoding") != "raw") refuse("its appended data is base64-encoded");
      break;  // the data follows
    } else if (t.name == "Piece") {
      ++pieces_seen;
      points_ = number(t, "NumberOfPoints", "0");
      if (points_ < 0) refuse("its NumberOfPoints is not a number");
    } else if (t.name == "DataArray") {
      const std::string parent = open.empty() ? "" : open.back();
      Array a;
      a.type = attr(t, "type");
      a.components = number(t, "NumberOfComponents", "1");
      const std::string name = parent == "Points" ? "points" : attr(t, "Name");
      if (parent == "Points" || parent == "PointData") {
        if (attr(t, "format") != "appended") {
          refuse("array '" + name + "' is stored " + attr(t, "format") + ", not appended");
        }
        if (type_size(a.type) == 0 || a.type == "UInt16" || a.type == "UInt32" ||
            a.type == "UInt64") {
          refuse("array '" + name + "' has type " + a.type);
        }
        const int64_t offset = number(t, "offset", "");
        if (offset < 0 || a.components < 1) refuse("array '" + name + "' has no valid offset");
        a.offset = static_cast<uint64_t>(std::max<int64_t>(offset, 0));
        arrays_[name] = a;
      } else if (parent == "CellData") {
        cell_arrays_[name] = a;
      }
    }
    if (!t.self_closing) open.push_back(t.name);
  }
  if (pieces_seen != 1) refuse("it has " + std::to_string(pieces_seen) + " pieces, not one");
  if (!arrays_.count("points")) refuse("it has no appended Points array");
}

VtuStream::~VtuStream() = default;

int64_t VtuStream::components(const std::string& name) const {
  const auto it = arrays_.find(name);
  TORCH_CHECK(it != arrays_.end(), "vtu: '", what_, "' has no point array '", name, "'");
  return it->second.components;
}

std::unique_ptr<VtuStream::Cursor> VtuStream::cursor(const std::string& name) const {
  TORCH_CHECK(supported(), "vtu: '", what_, "' cannot be streamed: ", unsupported_);
  const auto it = arrays_.find(name);
  TORCH_CHECK(it != arrays_.end(), "vtu: '", what_, "' has no point array '", name, "'");
  const std::string what = "'" + what_ + "' array '" + name + "'";
  const uint64_t start = data_start_ + it->second.offset;
#ifdef SLIPSTREAM_WITH_VTK
  if (!compressor_.empty()) {
    return std::make_unique<CompressedCursor>(*bytes_, start, it->second, points_, header64_,
                                              compressor_, what);
  }
#endif
  uint64_t nbytes = 0;
  bytes_->read(start, header64_ ? 8 : 4, &nbytes);
  const uint64_t want =
      static_cast<uint64_t>(points_) * it->second.components * type_size(it->second.type);
  TORCH_CHECK(nbytes == want, "vtu: ", what, " holds ", nbytes, " bytes; ", points_, " rows of ",
              it->second.components, " ", it->second.type, " are ", want);
  return std::make_unique<RawCursor>(*bytes_, start + (header64_ ? 8 : 4), it->second, points_,
                                     what);
}

}  // namespace slipstream::aero
