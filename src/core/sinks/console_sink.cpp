#include "core/sinks/console_sink.h"

#include <unistd.h>

#include <cmath>
#include <set>
#include <vector>

namespace slipstream {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto total = static_cast<long long>(std::llround(seconds));
  char buf[32];
  if (total >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", total / 3600, total / 60 % 60, total % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", total / 60, total % 60);
  }
  return buf;
}

namespace {

// "245.1k", "3.20M", "812".
std::string format_rate(double per_second) {
  char buf[32];
  if (per_second >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2fM", per_second / 1e6);
  } else if (per_second >= 1e3) {
    std::snprintf(buf, sizeof buf, "%.1fk", per_second / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f", per_second);
  }
  return buf;
}

std::string epoch_label(int64_t epoch, int64_t epochs) {
  return std::to_string(epoch) + (epochs > 0 ? "/" + std::to_string(epochs) : "");
}

}  // namespace

ConsoleSink::ConsoleSink(std::FILE* out, int every_n)
    : out_(out), every_n_(every_n < 1 ? 1 : every_n), tty_(isatty(fileno(out)) != 0) {}

void ConsoleSink::write(const LogRecord& record) {
  if (record.epochs > 0) epochs_ = record.epochs;
  if (!record.per_step) {
    summaries_[record.phase] = record;
    return;
  }
  const bool train = record.phase == "train";
  if (!train && record.phase != "val") return;
  Progress& p = progress_[record.phase];
  if (p.epoch != record.epoch || record.index_in_epoch <= 1) p = Progress{record.epoch};
  const double step = record.get("step_time_s");
  const double data = record.get("data_time_s");
  const double points = record.get("points");
  if (std::isfinite(step)) {
    if (record.index_in_epoch <= 1 || (p.first_step == 0 && p.later_count == 0)) {
      p.first_step = step;
    } else {
      p.later_steps += step;
      ++p.later_count;
    }
  }
  if (std::isfinite(data)) p.data += data;
  if (std::isfinite(points)) p.points += points;
  const double elapsed = p.first_step + p.later_steps;
  const double mean =
      p.later_count > 0 ? p.later_steps / static_cast<double>(p.later_count) : p.first_step;
  const double left = mean * static_cast<double>(std::max<int64_t>(
                                 record.steps_in_epoch - record.index_in_epoch, 0));
  std::string line =
      std::string(train ? "Epoch " : "Validation ") + epoch_label(record.epoch, record.epochs) +
      " [" + std::to_string(record.index_in_epoch) + "/" + std::to_string(record.steps_in_epoch) +
      "] " + format_duration(elapsed) + "<" + format_duration(left);
  char buf[160];
  std::snprintf(buf, sizeof buf, " Loss: %.6f", record.get("loss"));
  line += buf;
  if (train) {
    std::snprintf(buf, sizeof buf, " Step: %.3fs", step);
    line += buf;
    if (std::isfinite(points) && elapsed > 0)
      line += " " + format_rate(p.points / elapsed) + " pts/s";
    if (std::isfinite(data) && elapsed > 0) {
      std::snprintf(buf, sizeof buf, " Data: %.0f%%", 100.0 * std::min(p.data / elapsed, 1.0));
      line += buf;
    }
    const double mem = record.get("mem_gb");
    std::snprintf(buf, sizeof buf, " Mem: %.2fGB", std::isnan(mem) ? 0.0 : mem);
    line += buf;
  }
  write_line(record, line);
}

void ConsoleSink::write_line(const LogRecord& record, const std::string& line) {
  const bool last = record.index_in_epoch == record.steps_in_epoch;
  if (tty_) {
    const int width = 20;
    const int done = record.steps_in_epoch > 0
                         ? static_cast<int>(width * record.index_in_epoch / record.steps_in_epoch)
                         : 0;
    std::string bar(static_cast<size_t>(done), '=');
    bar.resize(width, ' ');
    std::fprintf(out_, "\r[%s] %s\x1b[K", bar.c_str(), line.c_str());
    bar_open_ = !last;
    if (last) std::fputc('\n', out_);
    std::fflush(out_);
    return;
  }
  if (record.index_in_epoch % every_n_ == 0 || last || record.index_in_epoch == 1) {
    std::fprintf(out_, "%s\n", line.c_str());
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
  double seconds = 0;
  for (const auto& phase : {"train", "val"}) {
    auto it = summaries_.find(phase);
    if (it == summaries_.end()) continue;
    const double s = it->second.get("epoch_seconds");
    if (std::isfinite(s)) seconds += s;
    for (const auto& f : it->second.fields) {
      if (f.kind == FieldKind::kIndex) continue;
      if (seen.insert(f.key).second) keys.push_back(f.key);
    }
  }
  std::string timing;
  if (seconds > 0) {
    timing = " (" + format_duration(seconds);
    if (epochs_ > epoch) {
      timing += "; about " + format_duration(seconds * static_cast<double>(epochs_ - epoch)) +
                (epochs_ == epoch + 1 ? " left for epoch " + std::to_string(epochs_)
                                      : " left for epochs " + std::to_string(epoch + 1) + "-" +
                                            std::to_string(epochs_));
    }
    timing += ")";
  }
  std::fprintf(out_, "Epoch %s summary%s\n  %-28s %14s %14s\n", epoch_label(epoch, epochs_).c_str(),
               timing.c_str(), "(losses, metrics: normalised)", "train", "val");
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
