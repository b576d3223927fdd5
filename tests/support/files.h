// Whole files as bytes, and a file cut into numbered pieces as DrivAerML
// ships big volumes (NAME.00.part, NAME.01.part, ...).
#pragma once

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

namespace slipstream::testing {

inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Writes `path`.00.part ... in `pieces` nearly equal pieces; `path` stays.
inline void split_into_parts(const std::string& path, int pieces) {
  const std::string bytes = file_bytes(path);
  const size_t size = bytes.size() / static_cast<size_t>(pieces);
  for (int i = 0; i < pieces; ++i) {
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, ".%02d.part", i);
    std::ofstream(path + suffix, std::ios::binary)
        << bytes.substr(static_cast<size_t>(i) * size, i + 1 == pieces ? std::string::npos : size);
  }
}

}  // namespace slipstream::testing
