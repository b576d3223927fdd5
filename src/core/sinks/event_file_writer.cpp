#include "core/sinks/event_file_writer.h"

#include "core/io/crc32c.h"

#include <c10/util/Exception.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace slipstream {
namespace {

// Protobuf wire types.
constexpr uint8_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_tag(std::string& out, uint32_t field, uint8_t wire) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | wire);
}

template <class T>
void put_fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // x86-64 and aarch64 are little-endian
  out.append(b, sizeof(T));
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_tag(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

std::atomic<int> g_file_counter{0};

struct Cursor {
  const std::string& buf;
  size_t pos;
  size_t end;
  const std::string& where;

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      TORCH_CHECK(pos < end, where, ": truncated varint");
      const auto byte = static_cast<uint8_t>(buf[pos++]);
      v |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if ((byte & 0x80) == 0) return v;
    }
    TORCH_CHECK(false, where, ": varint too long");
  }
  template <class T>
  T fixed() {
    TORCH_CHECK(pos + sizeof(T) <= end, where, ": truncated fixed field");
    T v;
    std::memcpy(&v, buf.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  Cursor sub() {
    const uint64_t n = varint();
    TORCH_CHECK(pos + n <= end, where, ": truncated nested message");
    Cursor c{buf, pos, pos + n, where};
    pos += n;
    return c;
  }
  void skip(uint8_t wire) {
    switch (wire) {
      case kVarint:
        varint();
        break;
      case kFixed64:
        fixed<uint64_t>();
        break;
      case kLengthDelimited:
        sub();
        break;
      case kFixed32:
        fixed<uint32_t>();
        break;
      default:
        TORCH_CHECK(false, where, ": unknown wire type ", int(wire));
    }
  }
};

std::pair<std::string, float> decode_value(Cursor c) {
  std::pair<std::string, float> out{"", 0.f};
  while (c.pos < c.end) {
    const uint64_t key = c.varint();
    const uint32_t field = key >> 3;
    const uint8_t wire = key & 7;
    if (field == 1 && wire == kLengthDelimited) {
      Cursor s = c.sub();
      out.first.assign(c.buf, s.pos, s.end - s.pos);
    } else if (field == 2 && wire == kFixed32) {
      out.second = c.fixed<float>();
    } else {
      c.skip(wire);
    }
  }
  return out;
}

TensorBoardEvent decode_event(const std::string& buf, size_t begin, size_t end,
                              const std::string& where) {
  TensorBoardEvent ev;
  Cursor c{buf, begin, end, where};
  while (c.pos < c.end) {
    const uint64_t key = c.varint();
    const uint32_t field = key >> 3;
    const uint8_t wire = key & 7;
    if (field == 1 && wire == kFixed64) {
      ev.wall_time = c.fixed<double>();
    } else if (field == 2 && wire == kVarint) {
      ev.step = static_cast<int64_t>(c.varint());
    } else if (field == 3 && wire == kLengthDelimited) {
      Cursor s = c.sub();
      ev.file_version.assign(buf, s.pos, s.end - s.pos);
    } else if (field == 7 && wire == kLengthDelimited) {
      Cursor log = c.sub();
      while (log.pos < log.end) {
        const uint64_t k = log.varint();
        if ((k >> 3) == 1 && (k & 7) == kVarint) {
          ev.session_start = log.varint() == 1;  // SessionLog.START
        } else {
          log.skip(k & 7);
        }
      }
    } else if (field == 5 && wire == kLengthDelimited) {
      Cursor summary = c.sub();
      while (summary.pos < summary.end) {
        const uint64_t k = summary.varint();
        if ((k >> 3) == 1 && (k & 7) == kLengthDelimited) {
          ev.scalars.push_back(decode_value(summary.sub()));
        } else {
          summary.skip(k & 7);
        }
      }
    } else {
      c.skip(wire);
    }
  }
  return ev;
}

}  // namespace

std::string encode_file_version_event(double wall_time) {
  std::string out;
  put_tag(out, 1, kFixed64);
  put_fixed<double>(out, wall_time);
  put_bytes(out, 3, "brain.Event:2");
  return out;
}

std::string encode_session_start_event(int64_t step, double wall_time) {
  std::string log;
  put_tag(log, 1, kVarint);  // SessionLog.status
  put_varint(log, 1);        // START
  std::string out;
  put_tag(out, 1, kFixed64);
  put_fixed<double>(out, wall_time);
  put_tag(out, 2, kVarint);
  put_varint(out, static_cast<uint64_t>(step));
  put_bytes(out, 7, log);  // Event.session_log
  return out;
}

std::string encode_scalar_event(int64_t step, double wall_time,
                                const std::vector<std::pair<std::string, float>>& values) {
  std::string summary;
  for (const auto& [tag, value] : values) {
    std::string v;
    put_bytes(v, 1, tag);
    put_tag(v, 2, kFixed32);
    put_fixed<float>(v, value);
    put_bytes(summary, 1, v);
  }
  std::string out;
  put_tag(out, 1, kFixed64);
  put_fixed<double>(out, wall_time);
  put_tag(out, 2, kVarint);
  put_varint(out, static_cast<uint64_t>(step));
  put_bytes(out, 5, summary);
  return out;
}

std::string frame_tfrecord(const std::string& data) {
  std::string out;
  out.reserve(data.size() + 16);
  const uint64_t length = data.size();
  put_fixed<uint64_t>(out, length);
  put_fixed<uint32_t>(out, masked_crc32c(out.data(), 8));
  out += data;
  put_fixed<uint32_t>(out, masked_crc32c(data.data(), data.size()));
  return out;
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TORCH_CHECK(!ec, "tensorboard: cannot create '", dir, "': ", ec.message());
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const auto now = std::chrono::system_clock::now();
  auto secs = std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
  // Later than every event file already here (a restart within a second, or
  // a clock that went back, must still sort after the earlier files).
  const std::string prefix = "events.out.tfevents.";
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    try {
      secs = std::max<int64_t>(secs, std::stoll(name.substr(prefix.size())) + 1);
    } catch (const std::exception&) {
      // Not one of ours: its name does not order ours.
    }
  }
  path_ = dir + "/events.out.tfevents." + std::to_string(secs) + "." + host + "." +
          std::to_string(getpid()) + "." + std::to_string(g_file_counter++);
  file_ = std::fopen(path_.c_str(), "wb");
  TORCH_CHECK(file_ != nullptr, "tensorboard: cannot create '", path_, "': ", std::strerror(errno));
  const double wall = std::chrono::duration<double>(now.time_since_epoch()).count();
  write_event(encode_file_version_event(wall));
}

EventFileWriter::~EventFileWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void EventFileWriter::write_event(const std::string& event_bytes) {
  const std::string record = frame_tfrecord(event_bytes);
  const size_t n = std::fwrite(record.data(), 1, record.size(), file_);
  TORCH_CHECK(n == record.size() && std::fflush(file_) == 0, "tensorboard: writing '", path_,
              "' failed: ", std::strerror(errno));
}

void EventFileWriter::add_scalars(int64_t step, double wall_time,
                                  const std::vector<std::pair<std::string, float>>& values) {
  write_event(encode_scalar_event(step, wall_time, values));
}

void EventFileWriter::add_session_start(int64_t step, double wall_time) {
  write_event(encode_session_start_event(step, wall_time));
}

void EventFileWriter::flush() { std::fflush(file_); }

std::vector<TensorBoardEvent> read_event_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in.good(), "tensorboard: cannot open '", path, "'");
  const std::string buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<TensorBoardEvent> events;
  size_t pos = 0;
  while (pos < buf.size()) {
    const std::string where = path + " at offset " + std::to_string(pos);
    TORCH_CHECK(pos + 12 <= buf.size(), "tensorboard: ", where, ": truncated record header");
    uint64_t length;
    uint32_t length_crc;
    std::memcpy(&length, buf.data() + pos, 8);
    std::memcpy(&length_crc, buf.data() + pos + 8, 4);
    TORCH_CHECK(length_crc == masked_crc32c(buf.data() + pos, 8), "tensorboard: ", where,
                ": length CRC mismatch");
    TORCH_CHECK(pos + 12 + length + 4 <= buf.size(), "tensorboard: ", where,
                ": truncated record of ", length, " bytes");
    uint32_t data_crc;
    std::memcpy(&data_crc, buf.data() + pos + 12 + length, 4);
    TORCH_CHECK(data_crc == masked_crc32c(buf.data() + pos + 12, length), "tensorboard: ", where,
                ": data CRC mismatch");
    events.push_back(decode_event(buf, pos + 12, pos + 12 + length, where));
    pos += 12 + length + 4;
  }
  return events;
}

}  // namespace slipstream
