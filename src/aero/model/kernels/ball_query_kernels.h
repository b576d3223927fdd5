// The ball query of ball_query.h on the GPU: for each query point the K
// nearest points within the radius, in increasing distance (ties: the lower
// index first), the remaining slots index 0 and the point (0, 0, 0). One
// thread per query scans every point through shared-memory tiles and keeps
// its K best in a max-heap, so the cost is N·M distance tests with no
// N·M buffer and no host sync; when the radius spans the domain (the
// largest scales) this is the exact K-nearest search. Plain C++ interface
// (raw device pointers, cudaStream_t as void*), like slice_kernels.h.
#pragma once

#include <cstdint>

namespace slipstream::aero::ball_query_kernels {

// The largest K the kernel takes.
constexpr int kMaxNeighbors = 128;

// points (b, n, 3), queries (b, m, 3): contiguous fp32; indices (b, m, k)
// int64 and neighbors (b, m, k, 3) fp32 are written. 1 <= k <= min(n,
// kMaxNeighbors). Asynchronous on `stream`.
void ball_query(const float* points, const float* queries, int64_t b, int64_t n, int64_t m,
                float radius, int k, int64_t* indices, float* neighbors, void* stream);

}  // namespace slipstream::aero::ball_query_kernels
