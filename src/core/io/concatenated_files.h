// A read-only, seekable std::istream over several files read as one, in
// order — for data shipped in pieces (DrivAerML's volume_i.vtu.00.part,
// .01.part, ...) that a reader wants as one stream, without writing the
// concatenation anywhere. Each piece is opened when first read; a seek
// anywhere in the total is a seek in one piece. Missing or unreadable
// pieces throw c10::Error naming them at construction.
#pragma once

#include <cstdint>
#include <fstream>
#include <istream>
#include <memory>
#include <streambuf>
#include <string>
#include <vector>

namespace slipstream {

class ConcatenatedFilesBuf : public std::streambuf {
 public:
  explicit ConcatenatedFilesBuf(std::vector<std::string> paths);
  int64_t total_size() const { return offsets_.back(); }

 protected:
  int_type underflow() override;
  std::streamsize showmanyc() override;
  pos_type seekoff(off_type off, std::ios_base::seekdir dir,
                   std::ios_base::openmode which) override;
  pos_type seekpos(pos_type pos, std::ios_base::openmode which) override;

 private:
  bool open_piece_at(int64_t position);  // positions the current piece; false at the end
  std::vector<std::string> paths_;
  std::vector<int64_t> offsets_;  // offsets_[i]: where piece i starts; back(): the total
  size_t piece_ = 0;
  std::ifstream file_;
  int64_t position_ = 0;  // of the first byte after the buffer's end
  std::vector<char> buffer_;
};

class ConcatenatedFilesStream : public std::istream {
 public:
  explicit ConcatenatedFilesStream(std::vector<std::string> paths);
  int64_t total_size() const { return buf_.total_size(); }

 private:
  ConcatenatedFilesBuf buf_;
};

}  // namespace slipstream
