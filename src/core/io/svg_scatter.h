// Scatter plots of predicted against true values as a standalone SVG (no
// plotting library): one panel per quantity, side by side, each with its
// points, the y = x line, axes with tick labels and a note (e.g. "R² 0.98").
// Both axes of a panel share one range (the data's, padded), so that the
// diagonal is the 45° line and distance from it reads as error. Ticks fall
// on round values (1, 2 or 5 times a power of ten); each panel is as wide as
// its tick labels need, and a note's parts separated by three spaces go on
// lines of their own, so that no text is clipped.
#pragma once

#include <string>
#include <vector>

namespace slipstream {

struct ScatterPanel {
  std::string title;  // e.g. "CD"
  std::string x_label = "true";
  std::string y_label = "predicted";
  std::vector<double> x, y;  // same length; non-finite pairs are left out
  std::string note;          // drawn in the top-left corner
};

// The SVG document. Throws c10::Error when a panel's x and y differ in length.
std::string scatter_svg(const std::vector<ScatterPanel>& panels);

// Round tick values inside [lo, hi] (about `target` of them, at least two
// where lo < hi) and their labels, all with the decimals the step needs.
struct Ticks {
  std::vector<double> values;
  std::vector<std::string> labels;
};
Ticks nice_ticks(double lo, double hi, int target = 5);

}  // namespace slipstream
