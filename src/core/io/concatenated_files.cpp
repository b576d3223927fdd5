#include "core/io/concatenated_files.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <filesystem>

namespace slipstream {

ConcatenatedFilesBuf::ConcatenatedFilesBuf(std::vector<std::string> paths)
    : paths_(std::move(paths)), buffer_(1 << 20) {
  TORCH_CHECK(!paths_.empty(), "concatenated files: no pieces given");
  offsets_.push_back(0);
  for (const auto& p : paths_) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(p, ec);
    TORCH_CHECK(!ec, "'", p, "' cannot be read: ", ec.message());
    offsets_.push_back(offsets_.back() + static_cast<int64_t>(size));
  }
  setg(buffer_.data(), buffer_.data(), buffer_.data());
}

bool ConcatenatedFilesBuf::open_piece_at(int64_t position) {
  if (position >= total_size()) return false;
  const auto it = std::upper_bound(offsets_.begin(), offsets_.end(), position);
  const size_t piece = static_cast<size_t>(it - offsets_.begin()) - 1;
  if (!file_.is_open() || piece != piece_) {
    file_.close();
    file_.clear();
    file_.open(paths_[piece], std::ios::binary);
    TORCH_CHECK(file_.is_open(), "'", paths_[piece], "' cannot be opened");
    piece_ = piece;
  }
  file_.clear();
  file_.seekg(position - offsets_[piece]);
  return true;
}

ConcatenatedFilesBuf::int_type ConcatenatedFilesBuf::underflow() {
  if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
  if (!open_piece_at(position_)) return traits_type::eof();
  const int64_t left_in_piece = offsets_[piece_ + 1] - position_;
  const auto want = static_cast<std::streamsize>(
      std::min<int64_t>(left_in_piece, static_cast<int64_t>(buffer_.size())));
  file_.read(buffer_.data(), want);
  const std::streamsize got = file_.gcount();
  TORCH_CHECK(got == want, "'", paths_[piece_], "' ended early (changed while being read?)");
  position_ += got;
  setg(buffer_.data(), buffer_.data(), buffer_.data() + got);
  return traits_type::to_int_type(*gptr());
}

std::streamsize ConcatenatedFilesBuf::showmanyc() {
  const int64_t left = total_size() - position_;
  return left > 0 ? static_cast<std::streamsize>(left) : -1;
}

ConcatenatedFilesBuf::pos_type ConcatenatedFilesBuf::seekoff(off_type off,
                                                             std::ios_base::seekdir dir,
                                                             std::ios_base::openmode which) {
  const int64_t current = position_ - (egptr() - gptr());
  int64_t target = off;
  if (dir == std::ios_base::cur) target += current;
  if (dir == std::ios_base::end) target += total_size();
  return seekpos(pos_type(target), which);
}

ConcatenatedFilesBuf::pos_type ConcatenatedFilesBuf::seekpos(pos_type pos,
                                                             std::ios_base::openmode which) {
  const auto target = static_cast<int64_t>(pos);
  if (!(which & std::ios_base::in) || target < 0 || target > total_size()) return pos_type(-1);
  position_ = target;
  setg(buffer_.data(), buffer_.data(), buffer_.data());  // refilled from `target` on next read
  return pos;
}

ConcatenatedFilesStream::ConcatenatedFilesStream(std::vector<std::string> paths)
    : std::istream(nullptr), buf_(std::move(paths)) {
  rdbuf(&buf_);
}

}  // namespace slipstream
