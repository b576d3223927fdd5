// ball_query: for each query point, the K nearest points within a radius,
// in increasing distance — the semantics of PhysicsNeMo's torch radius
// search, which GeoTransolver's multi-scale local features use. Slots with
// no point within the radius hold index 0 and the point (0, 0, 0). The
// output has a fixed size, so nothing is read back to the host.
//
// Distances are Euclidean in the points' dtype (computed as
// sqrt(sum of squared differences), as that search computes them), so the
// same points are chosen. On CUDA with fp32 points and K <= 128 a grid
// search does it (kernels/ball_query_kernels.h: no N·M buffer, exact);
// otherwise ATen's cdist + top-k, in query chunks that bound the (queries ×
// points) distance matrix to `max_elements` — the reference the kernel is
// tested against. Where the radius spans the domain this is a
// K-nearest-neighbour search over every point.
//
// ball_query_scales answers several (radius, K) at once from one search:
// scale s is the prefix within r_s of the max-K nearest within the largest
// radius. On the kernel that is exactly ball_query per scale; on the
// reference path too, but for the order top-k gives points at equal
// distance.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace slipstream::aero {

struct BallQueryResult {
  at::Tensor indices;    // (B, M, K) int64, into the points
  at::Tensor neighbors;  // (B, M, K, 3): the neighbours' coordinates
};

// points (B, N, 3), queries (B, M, 3); K <= N. On CPU tensors, non-finite
// coordinates are an error (on CUDA the loader's sample checks vouch for
// them: checking here would read a value back).
// Whether ball_query runs the CUDA kernel for these inputs.
bool uses_ball_query_kernel(const at::Tensor& points, const at::Tensor& queries, int64_t k);

BallQueryResult ball_query(const at::Tensor& points, const at::Tensor& queries, double radius,
                           int64_t k, int64_t max_elements = int64_t{1} << 28);

struct BallQueryScale {
  double radius;
  int64_t k;
};

// One result per scale, in order. Every K <= N; at most 8 scales on CUDA.
// points_per_cell > 0 makes the CUDA search use one grid of that many
// points a cell on average (for tuning and tests); 0, the default, its four
// grids of 1/8 to 64 (kernels/ball_query_kernels.h, Level). The result is
// the same either way.
std::vector<BallQueryResult> ball_query_scales(const at::Tensor& points, const at::Tensor& queries,
                                               const std::vector<BallQueryScale>& scales,
                                               int64_t max_elements = int64_t{1} << 28,
                                               int64_t points_per_cell = 0);

// The points' side of ball_query_scales, built once for any number of
// query sets: chunked inference asks for chunk after chunk of queries
// among all the points, and rebuilding the grids for each chunk would sort
// every point four times a chunk. Where the CUDA kernel takes the points
// (CUDA, fp32, N < 2^31) it holds the grids: a packed copy of the points
// and the cell starts per level, and the points' cell order, ~90 bytes a
// point at 20M points by their sizes; elsewhere the points alone.
// query(q, scales) equals ball_query_scales(points, q, scales) with the
// same points_per_cell. The points must stay unchanged while it is used.
class BallQueryIndex {
 public:
  explicit BallQueryIndex(const at::Tensor& points, int64_t points_per_cell = 0);
  ~BallQueryIndex();
  BallQueryIndex(const BallQueryIndex&) = delete;
  BallQueryIndex& operator=(const BallQueryIndex&) = delete;

  std::vector<BallQueryResult> query(const at::Tensor& queries,
                                     const std::vector<BallQueryScale>& scales,
                                     int64_t max_elements = int64_t{1} << 28) const;

 private:
  struct Grids;  // the CUDA search's levels (ball_query.cpp)
  at::Tensor points_;
  std::unique_ptr<Grids> grids_;  // null off the kernel's inputs
};

}  // namespace slipstream::aero
