// Joining names into one line, for error messages and logs.
#pragma once

#include <string>

namespace slipstream {

// The elements of `xs` (any range of strings, e.g. a vector or a set) in
// their order, separated by `sep`; `empty` when there are none.
template <typename Strings>
std::string join(const Strings& xs, const std::string& sep = ", ", const std::string& empty = "") {
  std::string out;
  bool first = true;
  for (const auto& x : xs) {
    if (!first) out += sep;
    out += x;
    first = false;
  }
  return first ? empty : out;
}

}  // namespace slipstream
