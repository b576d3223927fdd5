// A .vtu's points and point-data arrays read a block of rows at a time, so
// that a volume of any size is prepared in memory that does not grow with it.
//
// Reads VTK XML UnstructuredGrid files whose arrays are in the appended
// section, raw (not base64), uncompressed or compressed by VTK's zlib, LZ4
// or LZMA compressor, header_type UInt32 or UInt64, little-endian, one
// Piece; also such a file shipped in pieces (NAME.vtu.00.part, ...: one
// byte stream). That is what VTK's writer produces with
// SetDataModeToAppended + EncodeAppendedDataOff, and what ParaView saves by
// default, and what vtu_writer.h writes (uncompressed). Anything else (ASCII
// or base64 arrays, several pieces, a target stored as cell data; in a build
// without VTK, a compressed file) is `supported() == false` with the reason,
// and the caller reads the file whole through VTK instead.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace slipstream::aero {

class VtuStream {
 public:
  // Parses the XML header (a few KB); throws only when the files cannot be
  // read. `pieces`: one .vtu, or the byte pieces of one.
  explicit VtuStream(std::vector<std::string> pieces);
  ~VtuStream();
  VtuStream(const VtuStream&) = delete;
  VtuStream& operator=(const VtuStream&) = delete;

  bool supported() const { return unsupported_.empty(); }
  const std::string& why_unsupported() const { return unsupported_; }
  const std::string& what() const { return what_; }  // the file, in messages

  int64_t points() const { return points_; }
  bool has_point_array(const std::string& name) const { return arrays_.count(name) > 0; }
  // The array named `name` is cell data (VTK's reader moves it to the points).
  bool is_cell_array(const std::string& name) const { return cell_arrays_.count(name) > 0; }
  int64_t components(const std::string& name) const;

  // A reader of one array ("points" for the coordinates) from its first row
  // on: each next() returns the following `rows` rows, (rows, C) float32.
  class Cursor {
   public:
    virtual ~Cursor() = default;
    virtual torch::Tensor next(int64_t rows) = 0;
  };
  std::unique_ptr<Cursor> cursor(const std::string& name) const;

  struct Array {
    std::string type;  // Float32, Float64, Int32, ...
    int64_t components = 1;
    uint64_t offset = 0;  // in the appended data, from its '_'
  };

  class Bytes;  // the file or its pieces, read by byte ranges

 private:
  std::string what_, unsupported_;
  std::unique_ptr<Bytes> bytes_;
  uint64_t data_start_ = 0;  // the byte after the appended section's '_'
  bool header64_ = true;
  std::string compressor_;  // "" for none
  int64_t points_ = 0;
  std::map<std::string, Array> arrays_;  // "points" and the point data
  std::map<std::string, Array> cell_arrays_;
};

}  // namespace slipstream::aero
