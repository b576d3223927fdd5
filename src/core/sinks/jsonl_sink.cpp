#include "core/sinks/jsonl_sink.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>

namespace slipstream {

std::string utc_timestamp() {
  const auto now = std::chrono::system_clock::now();
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()) % 1000;
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  char out[48];
  std::snprintf(out, sizeof(out), "%s.%03dZ", buf, static_cast<int>(ms.count()));
  return out;
}

JsonlSink::JsonlSink(std::string path) : path_(std::move(path)) {
  file_ = std::fopen(path_.c_str(), "ab");
  TORCH_CHECK(file_ != nullptr, "jsonl: cannot open '", path_,
              "' for appending: ", std::strerror(errno));
}

JsonlSink::~JsonlSink() {
  if (file_ != nullptr) std::fclose(file_);
}

void JsonlSink::write_line(const std::string& line) {
  const size_t n = std::fwrite(line.data(), 1, line.size(), file_);
  TORCH_CHECK(n == line.size() && std::fflush(file_) == 0, "jsonl: writing '", path_,
              "' failed: ", std::strerror(errno));
}

void JsonlSink::write(const LogRecord& record) {
  nlohmann::ordered_json j;
  j["phase"] = record.kind;
  auto value = [](const Field& f) -> nlohmann::ordered_json {
    if (f.kind == FieldKind::kIndex) return static_cast<int64_t>(f.value);
    if (std::isfinite(f.value)) return f.value;
    return nullptr;
  };
  for (const auto& f : record.fields) {
    j[f.key] = value(f);
    // The recipe's records carry the total loss as both "loss" and "loss/total".
    if (f.kind == FieldKind::kLoss && f.key == "loss") j["loss/total"] = value(f);
  }
  j["ts"] = utc_timestamp();
  write_line(j.dump() + "\n");
}

void JsonlSink::write_document(const std::string& kind, const nlohmann::json& doc) {
  nlohmann::ordered_json j;
  j["phase"] = kind;
  if (doc.is_object()) {
    for (const auto& [k, v] : doc.items()) j[k] = v;
  } else {
    j[kind] = doc;
  }
  j["ts"] = utc_timestamp();
  write_line(j.dump() + "\n");
}

void JsonlSink::flush() { std::fflush(file_); }

}  // namespace slipstream
