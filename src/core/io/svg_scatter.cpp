#include "core/io/svg_scatter.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace slipstream {

namespace {
constexpr double kPlot = 300;       // the plot's width and height, px
constexpr double kTop = 28;         // room for the title
constexpr double kBottom = 46;      // the x tick labels and the x label
constexpr double kCharWidth = 6.6;  // an upper bound for an 11 px sans-serif glyph
constexpr double kLineHeight = 14;

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Width of `s` in px: UTF-8 continuation bytes take no room of their own.
double text_width(const std::string& s) {
  double chars = 0;
  for (unsigned char c : s) chars += (c & 0xC0) == 0x80 ? 0 : 1;
  return chars * kCharWidth;
}

std::vector<std::string> note_lines(const std::string& note) {
  std::vector<std::string> out;
  size_t from = 0;
  for (size_t at = note.find("   "); at != std::string::npos; at = note.find("   ", from)) {
    out.push_back(note.substr(from, at - from));
    from = note.find_first_not_of(' ', at);
    if (from == std::string::npos) break;
  }
  if (from != std::string::npos && from < note.size()) out.push_back(note.substr(from));
  return out;
}

struct Range {
  double lo = 0, hi = 1;
};

Range panel_range(const ScatterPanel& p) {
  TORCH_CHECK(p.x.size() == p.y.size(), "scatter_svg: panel '", p.title, "' has ", p.x.size(),
              " x values and ", p.y.size(), " y values");
  double lo = INFINITY, hi = -INFINITY;
  for (size_t i = 0; i < p.x.size(); ++i) {
    if (!std::isfinite(p.x[i]) || !std::isfinite(p.y[i])) continue;
    lo = std::min({lo, p.x[i], p.y[i]});
    hi = std::max({hi, p.x[i], p.y[i]});
  }
  if (!(lo <= hi)) return {};  // nothing finite to draw
  const double pad = hi > lo ? 0.08 * (hi - lo) : std::max(1e-3, 0.1 * std::abs(hi));
  return {lo - pad, hi + pad};
}

// A panel's layout: how far its plot sits from its left edge, and its width.
struct Layout {
  Range range;
  Ticks ticks;
  double margin = 0, width = 0;
};

Layout layout_of(const ScatterPanel& p) {
  Layout l;
  l.range = panel_range(p);
  l.ticks = nice_ticks(l.range.lo, l.range.hi);
  double widest = 0;
  for (const auto& t : l.ticks.labels) widest = std::max(widest, text_width(t));
  l.margin = 22 + widest + 10;  // the rotated y label, the tick labels, the ticks
  const double right = std::max(16.0, widest / 2 + 6);
  l.width = std::max(l.margin + kPlot + right, text_width(p.x_label) + 2 * l.margin);
  return l;
}

void draw_panel(std::ostringstream& svg, const ScatterPanel& p, const Layout& l, double left) {
  const double lo = l.range.lo, hi = l.range.hi;
  const double x0 = left + l.margin, y0 = kTop + kPlot;  // the plot's bottom-left corner
  auto sx = [&](double v) { return x0 + (v - lo) / (hi - lo) * kPlot; };
  auto sy = [&](double v) { return y0 - (v - lo) / (hi - lo) * kPlot; };
  svg << "<g font-family=\"sans-serif\" font-size=\"11\">\n";
  svg << "<text x=\"" << x0 + kPlot / 2 << "\" y=\"18\" text-anchor=\"middle\" font-size=\"13\" "
      << "font-weight=\"bold\">" << escape(p.title) << "</text>\n";
  svg << "<rect x=\"" << x0 << "\" y=\"" << y0 - kPlot << "\" width=\"" << kPlot << "\" height=\""
      << kPlot << "\" fill=\"none\" stroke=\"#444\"/>\n";
  for (size_t t = 0; t < l.ticks.values.size(); ++t) {
    const double v = l.ticks.values[t];
    const std::string label = escape(l.ticks.labels[t]);
    svg << "<line x1=\"" << sx(v) << "\" y1=\"" << y0 << "\" x2=\"" << sx(v) << "\" y2=\"" << y0 + 4
        << "\" stroke=\"#444\"/><text class=\"tick\" x=\"" << sx(v) << "\" y=\"" << y0 + 16
        << "\" text-anchor=\"middle\">" << label << "</text>\n";
    svg << "<line x1=\"" << x0 - 4 << "\" y1=\"" << sy(v) << "\" x2=\"" << x0 << "\" y2=\"" << sy(v)
        << "\" stroke=\"#444\"/><text class=\"tick\" x=\"" << x0 - 6 << "\" y=\"" << sy(v) + 4
        << "\" text-anchor=\"end\">" << label << "</text>\n";
  }
  svg << "<line class=\"identity\" x1=\"" << sx(lo) << "\" y1=\"" << sy(lo) << "\" x2=\"" << sx(hi)
      << "\" y2=\"" << sy(hi) << "\" stroke=\"#999\" stroke-dasharray=\"5,4\"/>\n";
  for (size_t i = 0; i < p.x.size(); ++i) {
    if (!std::isfinite(p.x[i]) || !std::isfinite(p.y[i])) continue;
    svg << "<circle class=\"point\" cx=\"" << sx(p.x[i]) << "\" cy=\"" << sy(p.y[i])
        << "\" r=\"3.5\" fill=\"#1f77b4\" fill-opacity=\"0.75\"/>\n";
  }
  const auto lines = note_lines(p.note);
  for (size_t i = 0; i < lines.size(); ++i) {
    svg << "<text class=\"note\" x=\"" << x0 + 8 << "\" y=\""
        << y0 - kPlot + 16 + kLineHeight * static_cast<double>(i) << "\">" << escape(lines[i])
        << "</text>\n";
  }
  svg << "<text x=\"" << x0 + kPlot / 2 << "\" y=\"" << y0 + 36 << "\" text-anchor=\"middle\">"
      << escape(p.x_label) << "</text>\n";
  svg << "<text transform=\"translate(" << left + 14 << "," << y0 - kPlot / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << escape(p.y_label) << "</text>\n";
  svg << "</g>\n";
}
}  // namespace

Ticks nice_ticks(double lo, double hi, int target) {
  Ticks t;
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return t;
  const double raw = (hi - lo) / std::max(target, 1);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / magnitude;
  const double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * magnitude;
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  const bool scientific = std::max(std::abs(lo), std::abs(hi)) >= 1e6 || step < 1e-5;
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + 1e-9 * step; k += 1) {
    const double v = k * step == 0 ? 0.0 : k * step;  // no "-0"
    char buf[32];
    if (scientific) {
      std::snprintf(buf, sizeof buf, "%.3g", v);
    } else {
      std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    }
    t.values.push_back(v);
    t.labels.emplace_back(buf);
  }
  return t;
}

std::string scatter_svg(const std::vector<ScatterPanel>& panels) {
  std::vector<Layout> layouts;
  double width = 0;
  for (const auto& p : panels) {
    layouts.push_back(layout_of(p));
    width += layouts.back().width;
  }
  if (panels.empty()) width = kPlot;
  const double height = kTop + kPlot + kBottom;
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << " " << height << "\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  double left = 0;
  for (size_t i = 0; i < panels.size(); ++i) {
    draw_panel(svg, panels[i], layouts[i], left);
    left += layouts[i].width;
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace slipstream
