// The ball query of ball_query.h on the GPU, at several scales at once: for
// each query point and scale s, the K_s nearest points within the radius
// r_s, in increasing distance (ties: the lower index first), the remaining
// slots index 0 and the point (0, 0, 0).
//
// One search serves every scale: the K_s nearest within r_s are the prefix
// within r_s of the K = max K_s nearest within R = max r_s, sorted. The
// search runs on a uniform grid over the points' bounding box, built on the
// device every call (no host sync), at several cell sizes (Level below):
//   1. cell_of: the cell of each point (and each query, clamped to the grid);
//   2. the caller sorts the points by cell (a stable sort: ATen) and finds
//      each cell's first point (searchsorted), and orders the queries by cell
//      so that a warp's threads search neighbouring cells;
//   3. pack: the sorted points as float4 (x, y, z, original index);
//   4. search: one warp per query visits shells of cells in increasing
//      Chebyshev distance, 32 points at a time, gathering those within R in
//      shared memory unsorted and keyed on (squared distance, index); it
//      sorts them and keeps its K best only when they fill its slots, at a
//      shell's end with more than K, and once at the end, and stops once no
//      unvisited cell can hold a point nearer than K of them (or within R).
//      Exact, like a scan of every point.
// Plain C++ interface (raw device pointers, cudaStream_t as void*), like
// slice_kernels.h.
#pragma once

#include <cstdint>

namespace slipstream::aero::ball_query_kernels {

// The largest K the search takes, and the most scales one call serves.
constexpr int kMaxNeighbors = 128;
constexpr int kMaxScales = 8;

// Where one scale's results go: indices (b, m, k) int64 and neighbors
// (b, m, k, 3) fp32.
struct ScaleOut {
  float radius = 0.f;
  int k = 0;
  int64_t* indices = nullptr;
  float* neighbors = nullptr;
};

// The grid: at most max_cells cells per batch over the bounding box lo..hi
// ((b, 3) fp32 each, on the device).
struct Grid {
  const float* lo = nullptr;
  const float* hi = nullptr;
  int64_t max_cells = 1;
};

// The cell (within its batch) of each of the b x n coordinates xyz (b, n, 3)
// into cells (b, n) int32; coordinates outside the box go to the nearest
// cell. Asynchronous on `stream`.
void cell_of(const Grid& grid, const float* xyz, int64_t b, int64_t n, int32_t* cells,
             void* stream);

// sorted (b, n) float4 = (points[order], order as int bits); order (b, n)
// int64, from the stable sort of the points' cells.
void pack(const float* points, const int64_t* order, int64_t b, int64_t n, float* sorted,
          void* stream);

// One grid of the search: its cells, the points sorted by cell (from pack)
// and each cell's first sorted point.
struct Level {
  Grid grid;
  const float* sorted = nullptr;        // (b, n, 4) from pack
  const int64_t* cell_start = nullptr;  // (b, max_cells + 1)
};

// The most grids one search takes. Points of a CFD mesh are far denser near
// the wall than away from it (the synthetic volume: ~180 times), so no one
// cell size suits every query: the levels are grids of growing cells, and
// each query searches the coarsest whose cell around it holds at most
// max_cell_points points (else the finest). Any level gives the same exact
// result; the choice only sets the work.
constexpr int kMaxLevels = 6;

struct Search {
  Level levels[kMaxLevels];  // finest first
  int num_levels = 0;
  int max_cell_points = 1;
  const float* points = nullptr;         // (b, n, 3), original order
  const float* queries = nullptr;        // (b, m, 3)
  const int64_t* query_order = nullptr;  // (b, m): queries in an order that keeps warps near
  int64_t b = 0, n = 0, m = 0;
  ScaleOut scales[kMaxScales];
  int num_scales = 0;
};

// Writes every scale's outputs. Each scale's k <= min(n, kMaxNeighbors).
void search(const Search& s, void* stream);

}  // namespace slipstream::aero::ball_query_kernels
