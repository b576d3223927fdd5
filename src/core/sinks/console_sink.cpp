#include "core/sinks/console_sink.h"

#include <unistd.h>

#include <cmath>
#include <set>
#include <vector>

namespace slipstream {

ConsoleSink::ConsoleSink(std::FILE* out, int every_n)
    : out_(out), every_n_(every_n < 1 ? 1 : every_n), tty_(isatty(fileno(out)) != 0) {}

void ConsoleSink::write(const LogRecord& record) {
  if (!record.per_step) {
    summaries_[record.phase] = record;
    return;
  }
  if (record.phase != "train") return;  // val steps show in the epoch table
  const bool last = record.index_in_epoch == record.steps_in_epoch;
  const double mem = record.get("mem_gb");
  char line[256];
  std::snprintf(line, sizeof(line), "Epoch %lld [%lld/%lld] Loss: %.6f Step: %.3fs Mem: %.2fGB",
                static_cast<long long>(record.epoch), static_cast<long long>(record.index_in_epoch),
                static_cast<long long>(record.steps_in_epoch), record.get("loss"),
                record.get("step_time_s"), std::isnan(mem) ? 0.0 : mem);
  if (tty_) {
    const int width = 20;
    const int done = record.steps_in_epoch > 0
                         ? static_cast<int>(width * record.index_in_epoch / record.steps_in_epoch)
                         : 0;
    std::string bar(static_cast<size_t>(done), '=');
    bar.resize(width, ' ');
    std::fprintf(out_, "\r[%s] %s\x1b[K", bar.c_str(), line);
    bar_open_ = !last;
    if (last) std::fputc('\n', out_);
    std::fflush(out_);
    return;
  }
  if (record.index_in_epoch % every_n_ == 0 || last || record.index_in_epoch == 1) {
    std::fprintf(out_, "%s\n", line);
    std::fflush(out_);
  }
}

void ConsoleSink::end_epoch(int64_t epoch) {
  if (bar_open_) {
    std::fputc('\n', out_);
    bar_open_ = false;
  }
  if (summaries_.empty()) return;
  std::vector<std::string> keys;
  std::set<std::string> seen;
  for (const auto& phase : {"train", "val"}) {
    auto it = summaries_.find(phase);
    if (it == summaries_.end()) continue;
    for (const auto& f : it->second.fields) {
      if (f.kind == FieldKind::kIndex) continue;
      if (seen.insert(f.key).second) keys.push_back(f.key);
    }
  }
  std::fprintf(out_, "Epoch %lld summary\n  %-28s %14s %14s\n", static_cast<long long>(epoch), "",
               "train", "val");
  for (const auto& key : keys) {
    auto cell = [&](const char* phase) {
      auto it = summaries_.find(phase);
      char buf[32] = "-";
      if (it != summaries_.end()) {
        const double v = it->second.get(key);
        if (!std::isnan(v)) std::snprintf(buf, sizeof(buf), "%.6g", v);
      }
      return std::string(buf);
    };
    std::fprintf(out_, "  %-28s %14s %14s\n", key.c_str(), cell("train").c_str(),
                 cell("val").c_str());
  }
  std::fflush(out_);
  summaries_.clear();
}

void ConsoleSink::flush() { std::fflush(out_); }

}  // namespace slipstream
