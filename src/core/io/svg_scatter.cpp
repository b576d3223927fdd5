#include "core/io/svg_scatter.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace slipstream {

namespace {
constexpr double kPanel = 360;  // panel width and height, px
constexpr double kMargin = 56;  // room for the tick labels
constexpr double kPlot = kPanel - kMargin - 16;

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

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

void draw_panel(std::ostringstream& svg, const ScatterPanel& p, double left) {
  TORCH_CHECK(p.x.size() == p.y.size(), "scatter_svg: panel '", p.title, "' has ", p.x.size(),
              " x values and ", p.y.size(), " y values");
  double lo = INFINITY, hi = -INFINITY;
  for (size_t i = 0; i < p.x.size(); ++i) {
    if (!std::isfinite(p.x[i]) || !std::isfinite(p.y[i])) continue;
    lo = std::min({lo, p.x[i], p.y[i]});
    hi = std::max({hi, p.x[i], p.y[i]});
  }
  if (!(lo <= hi)) lo = 0, hi = 1;  // nothing finite to draw
  const double pad = hi > lo ? 0.08 * (hi - lo) : std::max(1e-3, 0.1 * std::abs(hi));
  lo -= pad;
  hi += pad;
  const double x0 = left + kMargin, y0 = 24 + kPlot;  // the plot's bottom-left corner
  auto sx = [&](double v) { return x0 + (v - lo) / (hi - lo) * kPlot; };
  auto sy = [&](double v) { return y0 - (v - lo) / (hi - lo) * kPlot; };
  svg << "<g font-family=\"sans-serif\" font-size=\"11\">\n";
  svg << "<text x=\"" << x0 + kPlot / 2 << "\" y=\"16\" text-anchor=\"middle\" font-size=\"13\" "
      << "font-weight=\"bold\">" << escape(p.title) << "</text>\n";
  svg << "<rect x=\"" << x0 << "\" y=\"" << y0 - kPlot << "\" width=\"" << kPlot << "\" height=\""
      << kPlot << "\" fill=\"none\" stroke=\"#444\"/>\n";
  for (int t = 0; t <= 4; ++t) {
    const double v = lo + (hi - lo) * t / 4.0;
    svg << "<line x1=\"" << sx(v) << "\" y1=\"" << y0 << "\" x2=\"" << sx(v) << "\" y2=\"" << y0 + 4
        << "\" stroke=\"#444\"/><text x=\"" << sx(v) << "\" y=\"" << y0 + 16
        << "\" text-anchor=\"middle\">" << number(v) << "</text>\n";
    svg << "<line x1=\"" << x0 - 4 << "\" y1=\"" << sy(v) << "\" x2=\"" << x0 << "\" y2=\"" << sy(v)
        << "\" stroke=\"#444\"/><text x=\"" << x0 - 6 << "\" y=\"" << sy(v) + 4
        << "\" text-anchor=\"end\">" << number(v) << "</text>\n";
  }
  svg << "<line class=\"identity\" x1=\"" << sx(lo) << "\" y1=\"" << sy(lo) << "\" x2=\"" << sx(hi)
      << "\" y2=\"" << sy(hi) << "\" stroke=\"#999\" stroke-dasharray=\"5,4\"/>\n";
  for (size_t i = 0; i < p.x.size(); ++i) {
    if (!std::isfinite(p.x[i]) || !std::isfinite(p.y[i])) continue;
    svg << "<circle class=\"point\" cx=\"" << sx(p.x[i]) << "\" cy=\"" << sy(p.y[i])
        << "\" r=\"3.5\" fill=\"#1f77b4\" fill-opacity=\"0.75\"/>\n";
  }
  svg << "<text x=\"" << x0 + 8 << "\" y=\"" << y0 - kPlot + 16 << "\">" << escape(p.note)
      << "</text>\n";
  svg << "<text x=\"" << x0 + kPlot / 2 << "\" y=\"" << y0 + 32 << "\" text-anchor=\"middle\">"
      << escape(p.x_label) << "</text>\n";
  svg << "<text transform=\"translate(" << left + 12 << "," << y0 - kPlot / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << escape(p.y_label) << "</text>\n";
  svg << "</g>\n";
}
}  // namespace

std::string scatter_svg(const std::vector<ScatterPanel>& panels) {
  const double width = kPanel * static_cast<double>(std::max<size_t>(1, panels.size()));
  const double height = kPanel + 24;
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << " " << height << "\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (size_t i = 0; i < panels.size(); ++i) {
    draw_panel(svg, panels[i], kPanel * static_cast<double>(i));
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace slipstream
