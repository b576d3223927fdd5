// The scatter plot is a well-formed SVG with one point per finite pair, the
// y = x line and the note in every panel, and escapes its text; its ticks
// fall on round values and no text runs past the document's edges.
#include "core/io/svg_scatter.h"
#include "support/test_support.h"

#include <gtest/gtest.h>

#include <cmath>
#include <regex>

namespace slipstream {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(SvgScatterTest, EveryPanelHasItsPointsTheDiagonalAndItsNote) {
  ScatterPanel cd{"CD", "true", "predicted", {0.30, 0.32, 0.35}, {0.31, 0.31, 0.36}, "R² 0.9"};
  ScatterPanel cl{"CL <x&y>", "true", "predicted", {0.1, NAN}, {0.12, 0.2}, "n 1"};
  const std::string svg = scatter_svg({cd, cl});
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"point\""), 4u);  // the NaN pair is left out
  EXPECT_EQ(count(svg, "class=\"identity\""), 2u);
  EXPECT_NE(svg.find("R² 0.9"), std::string::npos);
  EXPECT_NE(svg.find("CL &lt;x&amp;y&gt;"), std::string::npos);
}

TEST(SvgScatterTest, TicksFallOnRoundValuesWithTheDecimalsTheStepNeeds) {
  // The Ahmed val split's CL range, which gave ticks like 0.0005967.
  const Ticks t = nice_ticks(-0.0123, 0.0187);
  ASSERT_GE(t.values.size(), 3u);
  ASSERT_LE(t.values.size(), 8u);
  const double step = t.values[1] - t.values[0];
  for (size_t i = 0; i < t.values.size(); ++i) {
    EXPECT_GE(t.values[i], -0.0123);
    EXPECT_LE(t.values[i], 0.0187);
    EXPECT_NEAR(std::remainder(t.values[i], step), 0.0, 1e-12) << t.labels[i];
    EXPECT_LE(t.labels[i].size(), 6u) << t.labels[i];  // "-0.010", "0.005"
  }
  EXPECT_EQ(nice_ticks(0.28, 0.37).labels,
            (std::vector<std::string>{"0.28", "0.30", "0.32", "0.34", "0.36"}));
  EXPECT_EQ(nice_ticks(-1, 1).labels.front(), "-1.0");
  for (const auto& label : nice_ticks(-0.5, 0.5).labels) EXPECT_NE(label, "-0.0");
}

TEST(SvgScatterTest, NoTextRunsPastTheDocumentAndLongNotesWrap) {
  // Wide tick labels and the longest note the forces plot writes.
  ScatterPanel cl{
      "CL over 'val'",          "true CL (integrated from the CFD fields)",
      "predicted CL",           {-0.0123, 0.0187, 0.004},
      {-0.011, 0.0175, 0.0041}, "R² undefined (the truth does not vary)   MAE 0.0004412   n 24"};
  ScatterPanel cd = cl;
  cd.title = "CD";
  cd.x = {123456.7, 123999.1};
  cd.y = {123470.2, 123980.4};
  const std::string svg = scatter_svg({cd, cl});
  const std::regex width_re("<svg[^>]* width=\"([0-9.]+)\"");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m, width_re));
  const double width = std::stod(m[1]);
  // Every anchored text's extent, at an upper bound of 6.6 px a glyph.
  const std::regex text_re(
      "<text (?:class=\"\\w+\" )?x=\"([-0-9.e]+)\" y=\"[-0-9.e]+\"(?: "
      "text-anchor=\"(\\w+)\")?[^>]*>"
      "([^<]*)</text>");
  size_t checked = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), text_re);
       it != std::sregex_iterator(); ++it) {
    const double x = std::stod((*it)[1]);
    const std::string anchor = (*it)[2];
    const double w = 6.6 * static_cast<double>((*it)[3].length());
    const double left = anchor == "end" ? x - w : anchor == "middle" ? x - w / 2 : x;
    EXPECT_GE(left, 0.0) << (*it)[0];
    EXPECT_LE(left + w, width + 1e-6) << (*it)[0];
    ++checked;
  }
  EXPECT_GT(checked, 20u);
  // The note's parts are lines of their own.
  EXPECT_EQ(count(svg, "class=\"note\""), 6u);
  EXPECT_NE(svg.find(">MAE 0.0004412</text>"), std::string::npos);
}

TEST(SvgScatterTest, MismatchedLengthsAreAnErrorNamingThePanel) {
  ScatterPanel p;
  p.title = "CMY";
  p.x = {1, 2};
  p.y = {1};
  const auto msg = testing::error_message_of([&] { scatter_svg({p}); });
  EXPECT_NE(msg.find("CMY"), std::string::npos) << msg;
}

}  // namespace
}  // namespace slipstream
