#include "aero/geometry/stl_file.h"

#include "core/io/atomic_file.h"

#include <c10/util/Exception.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <unordered_map>

namespace slipstream::aero {

namespace {

constexpr size_t kStlHeader = 80;
constexpr size_t kStlFacet = 50;  // 12 floats and a uint16

using Corner = std::array<float, 3>;

struct CornerHash {
  size_t operator()(const Corner& c) const {
    uint32_t b[3];
    std::memcpy(b, c.data(), sizeof(b));
    uint64_t h = 1469598103934665603ull;
    for (const uint32_t v : b) h = (h ^ v) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

// Corners merged as they come: equal float32 coordinates, one vertex (+0
// and -0 as one, as they compare equal).
class MergingBuilder {
 public:
  explicit MergingBuilder(const std::string& path) { mesh_.name = path; }
  void add(const std::array<Corner, 3>& t) {
    std::array<int64_t, 3> ids{};
    for (int k = 0; k < 3; ++k) {
      Corner c = t[static_cast<size_t>(k)];
      for (float& x : c) x = x == 0.f ? 0.f : x;
      const auto [it, fresh] = index_.try_emplace(c, static_cast<int64_t>(mesh_.vertices.size()));
      if (fresh) mesh_.vertices.push_back({c[0], c[1], c[2]});
      ids[static_cast<size_t>(k)] = it->second;
    }
    if (ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]) mesh_.faces.push_back(ids);
  }
  TriangleMesh take() { return std::move(mesh_); }

 private:
  TriangleMesh mesh_;
  std::unordered_map<Corner, int64_t, CornerHash> index_;
};

void read_binary_stl(const std::string& path, const std::string& bytes, uint32_t count,
                     MergingBuilder& out) {
  for (uint32_t i = 0; i < count; ++i) {
    const char* f = bytes.data() + kStlHeader + 4 + static_cast<size_t>(i) * kStlFacet;
    float v[12];
    std::memcpy(v, f, sizeof(v));
    std::array<Corner, 3> t{};
    for (int k = 0; k < 3; ++k) {
      for (int d = 0; d < 3; ++d) {
        const float x = v[3 + 3 * k + d];
        TORCH_CHECK(std::isfinite(x), "stl: '", path, "' triangle ", i,
                    " has a corner that is not finite");
        t[static_cast<size_t>(k)][static_cast<size_t>(d)] = x;
      }
    }
    out.add(t);
  }
}

void read_ascii_stl(const std::string& path, const std::string& bytes, MergingBuilder& out) {
  std::istringstream in(bytes);
  std::string word;
  std::array<Corner, 3> t{};
  int corners = 0;
  int64_t facet = 0;
  while (in >> word) {
    if (word == "vertex") {
      TORCH_CHECK(corners < 3, "stl: '", path, "' facet ", facet, " has more than 3 vertices");
      Corner& c = t[static_cast<size_t>(corners)];
      TORCH_CHECK(static_cast<bool>(in >> c[0] >> c[1] >> c[2]), "stl: '", path, "' facet ", facet,
                  " has a vertex without three numbers");
      for (const float x : c) {
        TORCH_CHECK(std::isfinite(x), "stl: '", path, "' facet ", facet,
                    " has a corner that is not finite");
      }
      ++corners;
    } else if (word == "endloop") {
      TORCH_CHECK(corners == 3, "stl: '", path, "' facet ", facet, " has ", corners,
                  " vertices, not 3");
      out.add(t);
      corners = 0;
      ++facet;
    }
  }
  TORCH_CHECK(corners == 0, "stl: '", path, "' ends inside a facet (truncated?)");
}

}  // namespace

TriangleMesh read_stl(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TORCH_CHECK(f.good(), "stl: '", path, "' does not exist or cannot be read");
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  TORCH_CHECK(!bytes.empty(), "stl: '", path, "' is empty");
  MergingBuilder out(path);
  uint32_t count = 0;
  if (bytes.size() >= kStlHeader + 4) std::memcpy(&count, bytes.data() + kStlHeader, 4);
  if (bytes.size() >= kStlHeader + 4 &&
      bytes.size() == kStlHeader + 4 + static_cast<size_t>(count) * kStlFacet) {
    read_binary_stl(path, bytes, count, out);
  } else {
    TORCH_CHECK(bytes.compare(0, 5, "solid") == 0, "stl: '", path,
                "' is neither binary STL (its size is not 84 + 50 bytes a triangle) nor ASCII STL "
                "(it does not start with 'solid'): truncated or not STL?");
    read_ascii_stl(path, bytes, out);
  }
  TriangleMesh mesh = out.take();
  TORCH_CHECK(!mesh.faces.empty(), "stl: '", path,
              "' has no triangles (empty, truncated or not STL?)");
  return mesh;
}

void write_stl(const std::string& path, const TriangleMesh& mesh) {
  const int64_t nv = static_cast<int64_t>(mesh.vertices.size());
  std::string bytes(kStlHeader + 4 + mesh.faces.size() * kStlFacet, '\0');
  const std::string header = "binary STL written by slipstream";
  std::memcpy(bytes.data(), header.data(), header.size());
  const auto count = static_cast<uint32_t>(mesh.faces.size());
  TORCH_CHECK(static_cast<size_t>(count) == mesh.faces.size(), "stl: '", path,
              "': more triangles than binary STL can count");
  std::memcpy(bytes.data() + kStlHeader, &count, 4);
  for (size_t i = 0; i < mesh.faces.size(); ++i) {
    std::array<std::array<double, 3>, 3> p{};
    for (int k = 0; k < 3; ++k) {
      const int64_t id = mesh.faces[i][static_cast<size_t>(k)];
      TORCH_CHECK(id >= 0 && id < nv, "stl: writing '", path, "': triangle ", i, " names vertex ",
                  id, " of ", nv);
      p[static_cast<size_t>(k)] = mesh.vertices[static_cast<size_t>(id)];
    }
    const std::array<double, 3> a{p[1][0] - p[0][0], p[1][1] - p[0][1], p[1][2] - p[0][2]};
    const std::array<double, 3> b{p[2][0] - p[0][0], p[2][1] - p[0][1], p[2][2] - p[0][2]};
    std::array<double, 3> n{a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2],
                            a[0] * b[1] - a[1] * b[0]};
    const double len = std::sqrt(n[0] * n[0] + n[1] * n[1] + n[2] * n[2]);
    for (double& x : n) x = len > 0 ? x / len : 0.0;
    float v[12];
    for (int d = 0; d < 3; ++d) v[d] = static_cast<float>(n[static_cast<size_t>(d)]);
    for (int k = 0; k < 3; ++k) {
      for (int d = 0; d < 3; ++d) {
        v[3 + 3 * k + d] = static_cast<float>(p[static_cast<size_t>(k)][static_cast<size_t>(d)]);
      }
    }
    std::memcpy(bytes.data() + kStlHeader + 4 + i * kStlFacet, v, sizeof(v));
  }
  write_file_atomically(path, bytes);
}

}  // namespace slipstream::aero
