#include "aero/model/kernels/ball_query_kernels.h"

#include <cuda_runtime.h>

#include <cfloat>
#include <climits>

#include "aero/model/kernels/launch.h"

namespace slipstream::aero::ball_query_kernels {
namespace {

constexpr int kThreads = 128;     // 4 warps, a query each
constexpr int kMaxDim = 1 << 20;  // cells along one axis

// The grid of one batch, computed by every thread from the box alone (the
// same inputs and operations, so the same result in each).
struct Geometry {
  float lo[3];
  float cell, inv_cell;
  int dims[3];
  float tol;  // the distance round-off may blur a cell face by
};

__device__ inline Geometry geometry_of(const Grid& grid, int64_t batch) {
  Geometry g{};
  float ext[3];
  float emax = 0.f, span = 0.f;
  for (int a = 0; a < 3; ++a) {
    g.lo[a] = grid.lo[3 * batch + a];
    ext[a] = fmaxf(grid.hi[3 * batch + a] - g.lo[a], 0.f);
    emax = fmaxf(emax, ext[a]);
    span = fmaxf(span, fabsf(g.lo[a]) + ext[a]);
  }
  double cell = 1.0;
  g.dims[0] = g.dims[1] = g.dims[2] = 1;
  if (emax > 0.f) {
    // Cells of about equal sides, a flat axis counted as 1/1024 of the
    // longest so the volume is never zero; grown until they fit max_cells.
    double volume = 1.0;
    for (int a = 0; a < 3; ++a) volume *= fmax(double(ext[a]), double(emax) / 1024.0);
    cell = cbrt(volume / double(grid.max_cells));
    for (;;) {
      int64_t cells = 1;
      for (int a = 0; a < 3; ++a) {
        const double d = ceil(double(ext[a]) / cell);
        g.dims[a] = d < 1.0 ? 1 : (d > kMaxDim ? kMaxDim : int(d));
        cells *= g.dims[a];
      }
      if (cells <= grid.max_cells) break;
      cell *= 1.05;
    }
  }
  g.cell = float(cell);
  g.inv_cell = float(1.0 / cell);
  g.tol = 1e-5f * (span + g.cell);
  return g;
}

__device__ inline int axis_cell(const Geometry& g, int a, float x) {
  const float c = floorf((x - g.lo[a]) * g.inv_cell);
  // fmaxf maps NaN to 0: a NaN coordinate lands in a cell, never outside.
  return int(fminf(fmaxf(c, 0.f), float(g.dims[a] - 1)));
}

__global__ void cell_kernel(Grid grid, const float* __restrict__ xyz, int64_t b, int64_t n,
                            int32_t* __restrict__ cells) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= b * n) return;
  const Geometry g = geometry_of(grid, i / n);
  const float* p = xyz + 3 * i;
  const int cx = axis_cell(g, 0, p[0]), cy = axis_cell(g, 1, p[1]), cz = axis_cell(g, 2, p[2]);
  cells[i] = (cz * g.dims[1] + cy) * g.dims[0] + cx;
}

__global__ void pack_kernel(const float* __restrict__ points, const int64_t* __restrict__ order,
                            int64_t b, int64_t n, float4* __restrict__ sorted) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= b * n) return;
  const int64_t batch = i / n, o = order[i];
  const float* p = points + 3 * (batch * n + o);
  sorted[i] = make_float4(p[0], p[1], p[2], __int_as_float(int(o)));
}

constexpr unsigned kFullWarp = 0xffffffffu;

// (squared distance, index) order: the nearer first, on a tie the lower index.
__device__ __forceinline__ bool before(float da, int ia, float db, int ib) {
  return da < db || (da == db && ia < ib);
}

// A query's best so far, sorted ascending in (squared distance, index),
// spread over a warp's registers: lane l holds positions l E .. l E + E - 1
// of 32 E. The first 32 E - K positions hold sentinels (-inf, -1), which come
// before every point and so never move; the list proper is the last K
// positions, unfilled ones (+inf, INT_MAX), and its K-th entry is always lane
// 31's last. No position is looked up at run time: an array indexed so would
// live in local memory, and each insert would go through it (the first form
// of this list did, 28 GB of L2 traffic a step at 200k points). Inserting a
// point is a warp-wide shift by one: no memory, and no order in which points
// must arrive.
template <int E>
struct WarpList {
  float d[E];
  int id[E];
  int lane;

  __device__ WarpList(int lane_, int k) : lane(lane_) {
#pragma unroll
    for (int s = 0; s < E; ++s) {
      const bool sentinel = lane * E + s < 32 * E - k;
      d[s] = sentinel ? -INFINITY : INFINITY;
      id[s] = sentinel ? -1 : INT_MAX;
    }
  }

  // Every lane calls it with the same (cd, ci), which must come before the
  // K-th entry.
  __device__ void insert(float cd, int ci) {
    int c = 0;
#pragma unroll
    for (int s = 0; s < E; ++s) c += before(d[s], id[s], cd, ci) ? 1 : 0;
    const int pos = int(__reduce_add_sync(kFullWarp, unsigned(c)));
    const float up_d = __shfl_up_sync(kFullWarp, d[E - 1], 1);
    const int up_i = __shfl_up_sync(kFullWarp, id[E - 1], 1);
#pragma unroll
    for (int s = E - 1; s >= 0; --s) {
      const int j = lane * E + s;
      const float prev_d = s > 0 ? d[s > 0 ? s - 1 : 0] : up_d;
      const int prev_i = s > 0 ? id[s > 0 ? s - 1 : 0] : up_i;
      d[s] = j > pos ? prev_d : (j == pos ? cd : d[s]);
      id[s] = j > pos ? prev_i : (j == pos ? ci : id[s]);
    }
  }

  // The K-th entry, on every lane.
  __device__ void kth(float& dk, int& ik) const {
    dk = __shfl_sync(kFullWarp, d[E - 1], 31);
    ik = __shfl_sync(kFullWarp, id[E - 1], 31);
  }
};

// One warp per query (all its control flow is the warp's, so every lane
// takes part in each shuffle): its lanes take 32 of a run's points at a
// time, and the points nearer than the list's K-th go into it one by one.
template <int E>
__global__ void __launch_bounds__(kThreads) search_kernel(Search s) {
  const int64_t batch = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int64_t t = (int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  if (t >= s.m) return;  // the whole warp
  const Geometry g = geometry_of(s.grid, batch);
  const int64_t qi = s.query_order[batch * s.m + t];
  const float* qp = s.queries + 3 * (batch * s.m + qi);
  const float q[3] = {qp[0], qp[1], qp[2]};
  const int c[3] = {axis_cell(g, 0, q[0]), axis_cell(g, 1, q[1]), axis_cell(g, 2, q[2])};
  float radius = 0.f;
  int k = 0;
  for (int i = 0; i < s.num_scales; ++i) {
    radius = fmaxf(radius, s.scales[i].radius);
    k = max(k, s.scales[i].k);
  }
  const float4* pts = reinterpret_cast<const float4*>(s.sorted) + batch * s.n;
  const int64_t* start = s.cell_start + batch * (s.grid.max_cells + 1);
  WarpList<E> best(lane, k);
  float kth_d = INFINITY;  // the K-th entry: what a point must come before
  int kth_i = INT_MAX;

  const auto visit = [&](int64_t first_cell, int64_t last_cell) {  // cells [first, last]
    const int64_t end = start[last_cell + 1];
    for (int64_t j0 = start[first_cell]; j0 < end; j0 += 32) {
      const int64_t j = j0 + lane;
      float d2 = INFINITY;
      int pid = INT_MAX;
      if (j < end) {
        const float4 p = pts[j];
        const float dx = q[0] - p.x, dy = q[1] - p.y, dz = q[2] - p.z;
        // Rounded as the reference computes it (no fused multiply-adds).
        d2 = __fadd_rn(__fadd_rn(__fmul_rn(dx, dx), __fmul_rn(dy, dy)), __fmul_rn(dz, dz));
        pid = __float_as_int(p.w);
      }
      const bool within = j < end && sqrtf(d2) <= radius;
      unsigned mask = __ballot_sync(kFullWarp, within && before(d2, pid, kth_d, kth_i));
      while (mask != 0u) {
        const int src = __ffs(mask) - 1;
        best.insert(__shfl_sync(kFullWarp, d2, src), __shfl_sync(kFullWarp, pid, src));
        best.kth(kth_d, kth_i);
        mask &= ~(1u << src);
        mask &= __ballot_sync(kFullWarp, within && before(d2, pid, kth_d, kth_i));
      }
    }
  };

  for (int h = 0;; ++h) {
    // Shell h: the cells at Chebyshev distance h from the query's. A run of
    // cells along x is a run of sorted points.
    const int x0 = max(c[0] - h, 0), x1 = min(c[0] + h, g.dims[0] - 1);
    const int y0 = max(c[1] - h, 0), y1 = min(c[1] + h, g.dims[1] - 1);
    const int z0 = max(c[2] - h, 0), z1 = min(c[2] + h, g.dims[2] - 1);
    for (int z = z0; z <= z1; ++z) {
      for (int y = y0; y <= y1; ++y) {
        const int64_t row = (int64_t(z) * g.dims[1] + y) * g.dims[0];
        if (abs(z - c[2]) == h || abs(y - c[1]) == h) {
          visit(row + x0, row + x1);
        } else {
          if (c[0] - h >= 0) visit(row + c[0] - h, row + c[0] - h);
          if (c[0] + h <= g.dims[0] - 1) visit(row + c[0] + h, row + c[0] + h);
        }
      }
    }
    // The nearest an unvisited cell can be: the distance to the nearest face
    // of the visited block that has cells beyond it.
    float bound = FLT_MAX;
    for (int a = 0; a < 3; ++a) {
      if (c[a] - h > 0) bound = fminf(bound, q[a] - (g.lo[a] + float(c[a] - h) * g.cell));
      if (c[a] + h < g.dims[a] - 1) {
        bound = fminf(bound, g.lo[a] + float(c[a] + h + 1) * g.cell - q[a]);
      }
    }
    if (bound == FLT_MAX) break;  // every cell visited
    bound -= g.tol;
    if (bound > radius) break;
    if (kth_d < INFINITY && bound > 0.f && kth_d < bound * bound) break;
  }

  const float* src = s.points + batch * s.n * 3;
  for (int i = 0; i < s.num_scales; ++i) {
    const ScaleOut& o = s.scales[i];
    int64_t* out_i = o.indices + (batch * s.m + qi) * o.k;
    float* out_p = o.neighbors + (batch * s.m + qi) * o.k * 3;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int j = lane * E + e - (32 * E - k);  // the j-th nearest
      if (j < 0 || j >= o.k) continue;
      const bool found = best.d[e] < INFINITY && sqrtf(best.d[e]) <= o.radius;
      const int idx = found ? best.id[e] : 0;
      out_i[j] = idx;
      out_p[3 * j] = found ? src[3 * idx] : 0.f;
      out_p[3 * j + 1] = found ? src[3 * idx + 1] : 0.f;
      out_p[3 * j + 2] = found ? src[3 * idx + 2] : 0.f;
    }
  }
}

template <int E>
void launch(const Search& s, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((s.m * 32 + kThreads - 1) / kThreads),
                  static_cast<unsigned>(s.b));
  search_kernel<E><<<grid, kThreads, 0, stream>>>(s);
  kernels::check_launch("ball query", "search_kernel");
}

unsigned blocks_for(int64_t count, int threads) {
  return static_cast<unsigned>((count + threads - 1) / threads);
}

}  // namespace

void cell_of(const Grid& grid, const float* xyz, int64_t b, int64_t n, int32_t* cells,
             void* stream) {
  if (b * n == 0) return;
  cell_kernel<<<blocks_for(b * n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(grid, xyz, b,
                                                                                     n, cells);
  kernels::check_launch("ball query", "cell_kernel");
}

void pack(const float* points, const int64_t* order, int64_t b, int64_t n, float* sorted,
          void* stream) {
  if (b * n == 0) return;
  pack_kernel<<<blocks_for(b * n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      points, order, b, n, reinterpret_cast<float4*>(sorted));
  kernels::check_launch("ball query", "pack_kernel");
}

void search(const Search& s, void* stream) {
  if (s.b == 0 || s.m == 0 || s.num_scales == 0) return;
  int k = 0;
  for (int i = 0; i < s.num_scales; ++i) k = s.scales[i].k > k ? s.scales[i].k : k;
  const auto st = static_cast<cudaStream_t>(stream);
  static_assert(kMaxNeighbors == 128, "the list spreads at most 4 entries over each lane");
  if (k <= 32) {
    launch<1>(s, st);
  } else if (k <= 64) {
    launch<2>(s, st);
  } else {
    launch<4>(s, st);
  }
}

}  // namespace slipstream::aero::ball_query_kernels
