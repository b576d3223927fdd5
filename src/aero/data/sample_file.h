// Slipstream's sample files: one safetensors file per sample, written by
// `prepare` and `make-synthetic --out`, read by DirectoryDataset.
//
// Format "slipstream-samples-v2" (metadata "format"):
//   <field>           (N, C) or (N): a point field, one row per point (or
//                     per surface cell)
//   <global>          a per-sample value; metadata "globals" lists them
//   mesh/vertices, mesh/offsets, mesh/connectivity
//                     a surface's polygons; polygon i is row i
//   checksum/<field>  int32 (ceil(N / chunk_rows)): the CRC-32C of the bytes
//                     of each chunk of chunk_rows rows of <field>
// and metadata: rows (N), row_order "permuted", row_seed, chunk_rows,
// points_mean "x,y,z" (the mean of all N points, which the center transform
// of a block needs), nonfinite (the point fields holding NaN or Inf, such
// as a target the loss masks; the points never do).
//
// The rows are a seeded random permutation of the source's order: file row
// i is source row row_permutation(N, row_seed)[i]. So any contiguous block
// of k rows is a uniform random sample of k points, and a training step
// reads one block per field, O(k) bytes whatever N is (docs/design.md).
// Reads verify the checksums of every chunk they touch: a file changed
// after it was written is named, with the field and rows, as soon as a
// changed chunk is read.
//
// v1 files (written before v2: no row_order) hold the rows in the source's
// order and no checksums; they are read whole.
#pragma once

#include "aero/data/sample.h"
#include "core/io/random_access_file.h"
#include "core/io/safetensors.h"

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace slipstream::aero {

// The format a sample file and a sample directory's manifest.json name;
// is_sample_format also accepts v1's name (older directories still read).
inline constexpr const char* kSampleFormat = "slipstream-samples-v2";
bool is_sample_format(const std::string& format);

struct SampleWriteOptions {
  bool permute = true;
  uint64_t row_seed = 0;  // 0: derived from the file's name
  int64_t chunk_rows = 16384;
  // SampleFileStreamWriter: rows per bucket file, a multiple of chunk_rows
  // (0: about 512k).
  int64_t bucket_rows = 0;
};

// A uniform random permutation of [0, n) from `seed`: Fisher-Yates driven by
// std::mt19937_64 with rejection sampling, so it is the same on every
// platform and library version.
std::vector<int64_t> row_permutation(int64_t n, uint64_t seed);
// Its inverse, 4 bytes a row: places[source row] = file row (n < 2^31).
std::vector<uint32_t> row_places(int64_t n, uint64_t seed);

// Writes `sample` atomically in the v2 layout. Checks that every point
// field has one row per point and that the points are finite (an error
// names the file, the field and the row); records which other fields hold
// non-finite values.
void write_sample_file(const std::string& path, const Sample& sample,
                       const SampleWriteOptions& options = {});

// Writes a v2 sample file from rows given in the source's order, a block at
// a time, in memory that does not grow with the rows beyond 4 bytes a row
// (each row's place in the permutation, row_places): each block's
// rows go to bucket files of ~1M permuted places ("<path>.tmp.<pid>.bucketK"),
// and commit() places each bucket's rows, checksums them and writes them
// where they belong. The file is byte for byte what write_sample_file writes
// for the same rows, fields and seed, but for the points' mean, summed
// block by block. Every point field is float32 (rows, channels), and
// "points" (3 channels) is one of them. Destroyed without commit(), it leaves no file behind.
class SampleFileStreamWriter {
 public:
  SampleFileStreamWriter(std::string path, int64_t rows,
                         std::vector<std::pair<std::string, int64_t>> fields,
                         const SampleWriteOptions& options = {});
  ~SampleFileStreamWriter();
  SampleFileStreamWriter(const SampleFileStreamWriter&) = delete;
  SampleFileStreamWriter& operator=(const SampleFileStreamWriter&) = delete;

  // The next rows of every field (name -> (n, channels)).
  void append(const std::map<std::string, at::Tensor>& block);
  int64_t written() const { return written_; }
  void commit(const std::string& id, const std::map<std::string, at::Tensor>& globals);

 private:
  void close_buckets();

  std::string path_;
  int64_t rows_;
  std::vector<std::pair<std::string, int64_t>> fields_;
  SampleWriteOptions options_;
  uint64_t seed_ = 0;
  size_t row_bytes_ = 0;
  std::vector<uint32_t> place_;  // source row -> file row
  int64_t bucket_rows_ = 0, written_ = 0, points_field_ = -1;
  std::vector<std::string> bucket_paths_;
  std::vector<std::FILE*> buckets_;
  std::vector<unsigned char> record_;
  std::set<std::string> nonfinite_;
  double sum_[3] = {0, 0, 0};
};

class SampleFile {
 public:
  // Reads the header (and the checksums) only.
  explicit SampleFile(std::string path);

  const std::string& path() const { return file_.path(); }
  int64_t rows() const { return rows_; }
  // A v2 file: rows in a random permutation, checksums per chunk.
  bool permuted() const { return permuted_; }
  uint64_t row_seed() const { return row_seed_; }
  SampleLayout layout() const;
  // The point fields the writer found non-finite values in.
  const std::set<std::string>& nonfinite() const { return nonfinite_; }

  // What the file is, in 32 bits, from its header alone: a CRC-32C of its
  // metadata, every tensor's name, type, shape and place, its globals'
  // values and its point fields' chunk checksums (so every point value,
  // through them). Another sample, or this one written again from other
  // data, has another; the mesh's values are not in it. Null for a v1 file
  // (no checksums). prepare and make-synthetic record it per sample in
  // manifest.json, and opening a dataset compares.
  std::optional<uint32_t> fingerprint() const;

  // The whole sample, mesh included; checksums verified.
  Sample read_all() const;
  // Rows [begin, begin + count) modulo N (a block may wrap past the last
  // row to the first), every point field and global, no mesh; `rows` and
  // `points_mean` set. Needs permuted(); checksums verified.
  Sample read_block(int64_t begin, int64_t count) const;

 private:
  bool is_point_field(const std::string& name) const;
  at::Tensor read_entry(const SafetensorsEntry& e) const;
  // Rows [a, b) of a point field, reading and verifying whole chunks.
  at::Tensor read_rows(const SafetensorsEntry& e, int64_t a, int64_t b) const;
  void verify(const SafetensorsEntry& e, const at::Tensor& rows, int64_t first_row) const;

  RandomAccessFile file_;
  SafetensorsIndex index_;
  std::set<std::string> globals_, nonfinite_;
  int64_t rows_ = 0, chunk_rows_ = 0;
  bool permuted_ = false;
  uint64_t row_seed_ = 0;
  at::Tensor points_mean_;
  std::map<std::string, at::Tensor> checksums_;  // field -> int32 per chunk
};

// Reads one sample file whole (no check beyond its format and checksums).
Sample read_sample_file(const std::string& path);
// The tensors a sample file holds, from its header alone.
SampleLayout read_sample_layout(const std::string& path);

}  // namespace slipstream::aero
