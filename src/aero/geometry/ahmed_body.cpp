#include "aero/geometry/ahmed_body.h"

#include "aero/geometry/vec3.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>

namespace slipstream::aero {

namespace {

using Point = std::array<double, 3>;

double radians(double deg) { return deg * M_PI / 180.0; }

// Where the slant starts (its upper edge) and how far the roof drops.
double slant_start(const AhmedBody& b) {
  return b.length - b.slant_length * std::cos(radians(b.slant_deg));
}
double slant_drop(const AhmedBody& b) { return b.slant_length * std::sin(radians(b.slant_deg)); }

// One section: half width, bottom and top z.
struct Section {
  double x, half_width, bottom, top;
};

Section section_at(const AhmedBody& b, double x) {
  const double r = b.front_radius;
  const double a = x < r ? r - std::sqrt(std::max(0.0, r * r - (r - x) * (r - x))) : 0.0;
  const double roof = b.clearance + b.height;
  const double drop = std::max(0.0, x - slant_start(b)) * std::tan(radians(b.slant_deg));
  return {x, 0.5 * b.width - a, b.clearance + a, std::min(roof - a, roof - drop)};
}

using vec3::cross;
using vec3::sub;

// A draw in [0, 1) from the generator's raw bits (the same on every
// standard library, unlike std::uniform_real_distribution).
double unit_draw(std::mt19937_64& g) { return static_cast<double>(g() >> 11) * 0x1.0p-53; }

}  // namespace

void check_ahmed_body(const AhmedBody& b) {
  const auto positive = [](double v, const char* name) {
    TORCH_CHECK(std::isfinite(v) && v > 0, "ahmed body: ", name, " must be > 0, not ", v);
  };
  positive(b.length, "length");
  positive(b.width, "width");
  positive(b.height, "height");
  positive(b.front_radius, "front_radius");
  positive(b.slant_length, "slant_length");
  TORCH_CHECK(std::isfinite(b.clearance) && b.clearance >= 0,
              "ahmed body: clearance must be >= 0, not ", b.clearance);
  TORCH_CHECK(2 * b.front_radius < std::min(b.width, b.height), "ahmed body: twice front_radius (",
              2 * b.front_radius, ") must be below the width and the height");
  TORCH_CHECK(std::isfinite(b.slant_deg) && b.slant_deg >= 0 && b.slant_deg < 90,
              "ahmed body: slant_deg must be in [0, 90), not ", b.slant_deg);
  TORCH_CHECK(slant_start(b) > b.front_radius, "ahmed body: the slant (", b.slant_length, " m at ",
              b.slant_deg, " degrees) does not fit behind the nose");
  TORCH_CHECK(slant_drop(b) < b.height, "ahmed body: the slant drops ", slant_drop(b),
              " m, more than the height ", b.height);
}

TriangleMesh ahmed_body_mesh(const AhmedBody& b, double edge) {
  check_ahmed_body(b);
  TORCH_CHECK(edge > 0 && edge < 0.5 * b.height, "ahmed body: edge ", edge,
              " must be > 0 and below half the height");
  // Stations along x: the nose's quarter circle by angle, then the roof and
  // the slant evenly.
  std::vector<double> xs;
  const double r = b.front_radius;
  const int nose = std::max(12, static_cast<int>(std::ceil(0.5 * M_PI * r / edge)));
  xs.reserve(static_cast<size_t>(nose));
  for (int m = 0; m < nose; ++m) xs.push_back(r * (1.0 - std::cos(0.5 * M_PI * m / nose)));
  const auto even = [&](double from, double to) {
    const int n = std::max(1, static_cast<int>(std::ceil((to - from) / edge)));
    for (int m = 0; m < n; ++m) xs.push_back(from + (to - from) * m / n);
  };
  const double xs0 = slant_start(b);
  even(r, xs0);
  even(xs0, b.length);
  xs.push_back(b.length);
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());

  // Each section's loop, counter-clockwise seen from +x: bottom (y up),
  // right side (z up), roof (y down), left side (z down).
  const int ny = std::max(2, static_cast<int>(std::ceil(b.width / edge)));
  const int nz = std::max(2, static_cast<int>(std::ceil(b.height / edge)));
  const int loop = 2 * (ny + nz);
  TriangleMesh mesh;
  mesh.name = "ahmed body";
  const auto loop_point = [&](const Section& s, int k) -> Point {
    const double w = s.half_width, z0 = s.bottom, z1 = s.top;
    if (k < ny) return {s.x, -w + 2 * w * k / ny, z0};
    k -= ny;
    if (k < nz) return {s.x, w, z0 + (z1 - z0) * k / nz};
    k -= nz;
    if (k < ny) return {s.x, w - 2 * w * k / ny, z1};
    k -= ny;
    return {s.x, -w, z1 - (z1 - z0) * k / nz};
  };
  for (double x : xs) {
    const Section s = section_at(b, x);
    for (int k = 0; k < loop; ++k) mesh.vertices.push_back(loop_point(s, k));
  }
  const auto at = [&](size_t station, int k) {
    return static_cast<int64_t>(station * loop + static_cast<size_t>((k + loop) % loop));
  };
  // The sides: loop tangent t and x along the body give t x x, outward.
  for (size_t j = 0; j + 1 < xs.size(); ++j) {
    for (int k = 0; k < loop; ++k) {
      const int64_t a = at(j, k), bb = at(j, k + 1), c = at(j + 1, k + 1), d = at(j + 1, k);
      mesh.faces.push_back({a, bb, c});
      mesh.faces.push_back({a, c, d});
    }
  }
  // The caps: a grid whose border is the end loop, facing -x at the nose
  // and +x at the base.
  const auto cap = [&](size_t station, double facing) {
    const Section s = section_at(b, xs[station]);
    std::vector<int64_t> grid(static_cast<size_t>(ny + 1) * static_cast<size_t>(nz + 1));
    const auto id = [&](int i, int k) -> int64_t& {
      return grid[static_cast<size_t>(k) * static_cast<size_t>(ny + 1) + static_cast<size_t>(i)];
    };
    for (int k = 0; k <= nz; ++k) {
      for (int i = 0; i <= ny; ++i) {
        if (k == 0) {
          id(i, k) = at(station, i);
        } else if (i == ny) {
          id(i, k) = at(station, ny + k);
        } else if (k == nz) {
          id(i, k) = at(station, ny + nz + (ny - i));
        } else if (i == 0) {
          id(i, k) = at(station, 2 * ny + nz + (nz - k));
        } else {
          id(i, k) = static_cast<int64_t>(mesh.vertices.size());
          mesh.vertices.push_back({s.x, -s.half_width + 2 * s.half_width * i / ny,
                                   s.bottom + (s.top - s.bottom) * k / nz});
        }
      }
    }
    const auto add = [&](int64_t p, int64_t q, int64_t w) {
      const auto& vp = mesh.vertices[static_cast<size_t>(p)];
      const Point n = cross(sub(mesh.vertices[static_cast<size_t>(q)], vp),
                            sub(mesh.vertices[static_cast<size_t>(w)], vp));
      if (n[0] * facing >= 0) {
        mesh.faces.push_back({p, q, w});
      } else {
        mesh.faces.push_back({p, w, q});
      }
    };
    for (int k = 0; k < nz; ++k) {
      for (int i = 0; i < ny; ++i) {
        add(id(i, k), id(i + 1, k), id(i + 1, k + 1));
        add(id(i, k), id(i + 1, k + 1), id(i, k + 1));
      }
    }
  };
  cap(0, -1.0);
  cap(xs.size() - 1, 1.0);
  return mesh;
}

double ahmed_body_volume(const AhmedBody& b) {
  check_ahmed_body(b);
  const double r = b.front_radius, w = b.width, h = b.height;
  // Over the nose, with u = R - x and s = sqrt(R^2 - u^2) the section is
  // (W - 2R + 2s)(H - 2R + 2s); int s du = pi R^2 / 4, int s^2 du = 2 R^3 / 3.
  const double nose = (w - 2 * r) * (h - 2 * r) * r + 2 * (w + h - 4 * r) * M_PI * r * r / 4 +
                      4 * 2 * r * r * r / 3;
  const double run = b.slant_length * std::cos(radians(b.slant_deg));
  return nose + (b.length - r) * w * h - 0.5 * run * slant_drop(b) * w;
}

std::vector<AhmedBody> ahmed_latin_hypercube(int64_t cases, uint64_t seed) {
  TORCH_CHECK(cases > 0, "ahmed bodies: cases must be > 0, not ", cases);
  std::mt19937_64 g(seed);
  const auto n = static_cast<size_t>(cases);
  // Per column: a stratum per case, shuffled (Fisher-Yates), then a draw within it.
  const auto column = [&] {
    std::vector<size_t> strata(n);
    for (size_t i = 0; i < n; ++i) strata[i] = i;
    for (size_t i = n - 1; i > 0; --i) std::swap(strata[i], strata[g() % (i + 1)]);
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) {
      out[i] = (static_cast<double>(strata[i]) + unit_draw(g)) / static_cast<double>(n);
    }
    return out;
  };
  const auto slant = column(), length = column(), width = column(), height = column();
  std::vector<AhmedBody> bodies(n);
  const AhmedBody standard;
  for (size_t i = 0; i < n; ++i) {
    bodies[i].slant_deg = 40.0 * slant[i];
    bodies[i].length = standard.length * (0.9 + 0.2 * length[i]);
    bodies[i].width = standard.width * (0.9 + 0.2 * width[i]);
    bodies[i].height = standard.height * (0.9 + 0.2 * height[i]);
  }
  return bodies;
}

}  // namespace slipstream::aero
