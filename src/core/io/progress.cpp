#include "core/io/progress.h"

#include <unistd.h>

#include <algorithm>

namespace slipstream {

ProgressBar::ProgressBar(std::string label, double quiet_s, std::FILE* out)
    : label_(std::move(label)),
      quiet_s_(quiet_s),
      out_(out),
      tty_(isatty(fileno(out)) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressBar::~ProgressBar() {
  if (drawn_ && tty_ && !finished_) std::fputc('\n', out_);
}

double ProgressBar::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void ProgressBar::update(double fraction) {
  if (finished_) return;
  fraction = std::clamp(fraction, 0.0, 1.0);
  const double t = elapsed();
  const bool last = fraction >= 1.0;
  if (tty_) {
    const auto now = std::chrono::steady_clock::now();
    if (t < quiet_s_ && !drawn_) return;
    if (!last && drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, ' ');
    std::fprintf(out_, "\r%s [%s] %3d%%  %.1f s", label_.c_str(), bar.c_str(),
                 static_cast<int>(fraction * 100), t);
    if (last) std::fputc('\n', out_);
    std::fflush(out_);
    drawn_ = true;
  } else {
    while (next_quarter_ <= 4 && fraction >= next_quarter_ / 4.0) {
      if (t >= quiet_s_) {
        std::fprintf(out_, "%s: %d%% (%.1f s)\n", label_.c_str(), next_quarter_ * 25, t);
        std::fflush(out_);
        drawn_ = true;
      }
      ++next_quarter_;
    }
  }
  finished_ = last;
}

}  // namespace slipstream
