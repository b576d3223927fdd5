// Scatter plots of predicted against true values as a standalone SVG (no
// plotting library): one panel per quantity, side by side, each with its
// points, the y = x line, axes with tick labels and a note (e.g. "R² 0.98").
// Both axes of a panel share one range (the data's, padded), so that the
// diagonal is the 45° line and distance from it reads as error.
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

}  // namespace slipstream
