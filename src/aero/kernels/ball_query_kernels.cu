#include "aero/kernels/ball_query_kernels.h"

#include <cuda_runtime.h>

#include <cfloat>
#include <climits>

#include "aero/kernels/common/launch.h"

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
constexpr unsigned long long kNoKey = ~0ull;

// A candidate's sort key: (squared distance, index), the nearer first and on
// a tie the lower index. Squared distances are never negative, so their bits
// order as the floats do.
__device__ __forceinline__ unsigned long long key_of(float d2, int pid) {
  return (static_cast<unsigned long long>(__float_as_uint(d2)) << 32) | static_cast<unsigned>(pid);
}
__device__ __forceinline__ float distance2_of(unsigned long long key) {
  return __uint_as_float(static_cast<unsigned>(key >> 32));
}

// A query's candidates, in C slots of shared memory (the warp's own): the
// visited points within the radius that may still be among its K nearest.
// Points are appended 32 at a time, unsorted; the slots are sorted (a
// bitonic network over the warp) and cut to the K best only when they fill,
// when a shell ends with more than K (so the next, larger shell is filtered
// by the K-th), and once at the end. Cutting keeps the K best of all points
// offered so far, so the end result is exact. (The first form kept a sorted
// list in registers and inserted one point at a time, each insert a
// warp-wide shift: ~300 inserts a query at K 128, the search's whole cost.)
template <int C>
struct Candidates {
  unsigned long long* slot;
  int lane, k;
  int count = 0;  // the same on every lane
  // The K-th kept at the last cut: nothing at or above it can be among the K.
  unsigned long long cut = kNoKey;
  bool sorted = true;

  __device__ Candidates(unsigned long long* slots, int lane_, int k_)
      : slot(slots), lane(lane_), k(k_) {}

  // Sorts the slots (a bitonic network over the next power of two) and keeps
  // the first K.
  __device__ void sort_and_cut() {
    int p = 32;
    while (p < count) p <<= 1;
    for (int i = count + lane; i < p; i += 32) slot[i] = kNoKey;
    __syncwarp();
    for (int size = 2; size <= p; size <<= 1) {
      for (int stride = size >> 1; stride > 0; stride >>= 1) {
        for (int t = lane; t < p / 2; t += 32) {
          const int i = 2 * t - (t & (stride - 1)), j = i + stride;
          const unsigned long long a = slot[i], b = slot[j];
          if ((a > b) == ((i & size) == 0)) {
            slot[i] = b;
            slot[j] = a;
          }
        }
        __syncwarp();
      }
    }
    if (count >= k) {
      count = k;
      cut = slot[k - 1];
    }
    sorted = true;
  }

  // Every lane calls it: its point (if `ok`) and key.
  __device__ void offer(bool ok, unsigned long long key) {
    bool take = ok && key < cut;
    unsigned mask = __ballot_sync(kFullWarp, take);
    if (mask == 0u) return;
    if (count + __popc(mask) > C) {
      sort_and_cut();
      take = ok && key < cut;
      mask = __ballot_sync(kFullWarp, take);
    }
    if (take) slot[count + __popc(mask & ((1u << lane) - 1u))] = key;
    count += __popc(mask);
    sorted = sorted && mask == 0u;
  }

  // How many candidates lie nearer than sqrt(d2).
  __device__ int nearer_than(float d2) {
    __syncwarp();
    int c = 0;
    for (int i = lane; i < count; i += 32) c += distance2_of(slot[i]) < d2 ? 1 : 0;
    return int(__reduce_add_sync(kFullWarp, unsigned(c)));
  }
};

// One warp per query (all its control flow is the warp's, so every lane
// takes part in each shuffle): its lanes take 32 of a run's points at a
// time and offer those within the radius to the query's candidates.
template <int C>
__global__ void __launch_bounds__(kThreads, 8) search_kernel(Search s) {
  __shared__ unsigned long long slots[kThreads / 32][C];
  const int64_t batch = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int64_t t = (int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  if (t >= s.m) return;  // the whole warp
  const int64_t qi = s.query_order[batch * s.m + t];
  const float* qp = s.queries + 3 * (batch * s.m + qi);
  const float q[3] = {qp[0], qp[1], qp[2]};
  // The level: the coarsest whose cell around the query is not too full.
  int level = 0;
  for (int l = s.num_levels - 1; l > 0; --l) {
    const Geometry gl = geometry_of(s.levels[l].grid, batch);
    const int64_t* st = s.levels[l].cell_start + batch * (s.levels[l].grid.max_cells + 1);
    const int cell = (axis_cell(gl, 2, q[2]) * gl.dims[1] + axis_cell(gl, 1, q[1])) * gl.dims[0] +
                     axis_cell(gl, 0, q[0]);
    if (st[cell + 1] - st[cell] <= s.max_cell_points) {
      level = l;
      break;
    }
  }
  const Level& lv = s.levels[level];
  const Geometry g = geometry_of(lv.grid, batch);
  const int c[3] = {axis_cell(g, 0, q[0]), axis_cell(g, 1, q[1]), axis_cell(g, 2, q[2])};
  float radius = 0.f;
  int k = 0;
  for (int i = 0; i < s.num_scales; ++i) {
    radius = fmaxf(radius, s.scales[i].radius);
    k = max(k, s.scales[i].k);
  }
  const float4* pts = reinterpret_cast<const float4*>(lv.sorted) + batch * s.n;
  const int64_t* start = lv.cell_start + batch * (lv.grid.max_cells + 1);
  Candidates<C> best(slots[threadIdx.x >> 5], lane, k);

  const auto offer = [&](int64_t j, bool valid) {  // sorted point j, if valid
    float d2 = INFINITY;
    int pid = INT_MAX;
    if (valid) {
      const float4 p = pts[j];
      const float dx = q[0] - p.x, dy = q[1] - p.y, dz = q[2] - p.z;
      // Rounded as the reference computes it (no fused multiply-adds).
      d2 = __fadd_rn(__fadd_rn(__fmul_rn(dx, dx), __fmul_rn(dy, dy)), __fmul_rn(dz, dz));
      pid = __float_as_int(p.w);
    }
    best.offer(valid && sqrtf(d2) <= radius, key_of(d2, pid));
  };

  for (int h = 0;; ++h) {
    // Shell h: the cells at Chebyshev distance h from the query's, as runs
    // of sorted points (a run of cells along x is one). A row (z, y) of the
    // block on the shell's faces is one run, x0..x1; any other row holds the
    // shell's cells x = c - h and c + h, where they exist. The lanes take 32
    // rows at a time and find their runs' bounds at once (one round of
    // loads, not one a run), then the warp takes the rows' points 32 at a
    // time, each lane finding its point's run by a binary search over the
    // lanes' running totals.
    const int x0 = max(c[0] - h, 0), x1 = min(c[0] + h, g.dims[0] - 1);
    const int y0 = max(c[1] - h, 0), y1 = min(c[1] + h, g.dims[1] - 1);
    const int z0 = max(c[2] - h, 0), z1 = min(c[2] + h, g.dims[2] - 1);
    const int ny = y1 - y0 + 1, rows = ny * (z1 - z0 + 1);
    for (int r0 = 0; r0 < rows; r0 += 32) {
      const int r = r0 + lane;
      int a_first = 0, a_count = 0, b_first = 0, b_count = 0;  // this lane's row: up to two runs
      if (r < rows) {
        const int z = z0 + r / ny, y = y0 + r % ny;
        const int64_t row = (int64_t(z) * g.dims[1] + y) * g.dims[0];
        const auto run = [&](int64_t first_cell, int64_t last_cell, int& first, int& count) {
          first = int(start[first_cell]);
          count = int(start[last_cell + 1]) - first;
        };
        if (abs(z - c[2]) == h || abs(y - c[1]) == h) {
          run(row + x0, row + x1, a_first, a_count);
        } else {
          if (c[0] - h >= 0) run(row + c[0] - h, row + c[0] - h, a_first, a_count);
          if (c[0] + h <= g.dims[0] - 1) run(row + c[0] + h, row + c[0] + h, b_first, b_count);
        }
      }
      int upto = a_count + b_count;  // the points of rows r0 .. r, inclusive
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int v = __shfl_up_sync(kFullWarp, upto, d);
        if (lane >= d) upto += v;
      }
      const int before = upto - a_count - b_count;
      const int total = __shfl_sync(kFullWarp, upto, 31);
      for (int o0 = 0; o0 < total; o0 += 32) {
        const int o = min(o0 + lane, total - 1);
        int owner = 0;  // the first lane whose running total passes o
#pragma unroll
        for (int step = 16; step > 0; step >>= 1) {
          if (__shfl_sync(kFullWarp, upto, owner + step - 1) <= o) owner += step;
        }
        const int at = o - __shfl_sync(kFullWarp, before, owner);
        const int na = __shfl_sync(kFullWarp, a_count, owner);
        const int fa = __shfl_sync(kFullWarp, a_first, owner);
        const int fb = __shfl_sync(kFullWarp, b_first, owner);
        offer(at < na ? fa + at : fb + at - na, o0 + lane < total);
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
    // Done once K candidates are nearer than any unvisited point can be.
    if (best.count >= k && bound > 0.f && best.nearer_than(bound * bound) >= k) break;
    if (best.count > k) best.sort_and_cut();
  }
  if (!best.sorted || best.count > k) best.sort_and_cut();

  const float* src = s.points + batch * s.n * 3;
  for (int i = 0; i < s.num_scales; ++i) {
    const ScaleOut& o = s.scales[i];
    int64_t* out_i = o.indices + (batch * s.m + qi) * o.k;
    float* out_p = o.neighbors + (batch * s.m + qi) * o.k * 3;
    for (int j = lane; j < o.k; j += 32) {  // the j-th nearest
      const unsigned long long key = j < best.count ? best.slot[j] : kNoKey;
      const bool found = key != kNoKey && sqrtf(distance2_of(key)) <= o.radius;
      const int idx = found ? int(static_cast<unsigned>(key)) : 0;
      out_i[j] = idx;
      out_p[3 * j] = found ? src[3 * idx] : 0.f;
      out_p[3 * j + 1] = found ? src[3 * idx + 1] : 0.f;
      out_p[3 * j + 2] = found ? src[3 * idx + 2] : 0.f;
    }
  }
}

template <int C>
void launch(const Search& s, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((s.m * 32 + kThreads - 1) / kThreads),
                  static_cast<unsigned>(s.b));
  search_kernel<C><<<grid, kThreads, 0, stream>>>(s);
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
  // Room for K and a few batches of 32 beyond it before a cut.
  static_assert(kMaxNeighbors == 128, "the largest candidate set holds 512");
  if (k <= 32) {
    launch<128>(s, st);
  } else if (k <= 64) {
    launch<256>(s, st);
  } else {
    launch<512>(s, st);
  }
}

}  // namespace slipstream::aero::ball_query_kernels
