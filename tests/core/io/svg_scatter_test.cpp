// The scatter plot is a well-formed SVG with one point per finite pair, the
// y = x line and the note in every panel, and escapes its text.
#include "core/io/svg_scatter.h"
#include "support/test_support.h"

#include <gtest/gtest.h>

#include <cmath>

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
  EXPECT_NE(svg.find("width=\"720\""), std::string::npos);  // two panels side by side
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
