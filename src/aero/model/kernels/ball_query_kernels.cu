#include "aero/model/kernels/ball_query_kernels.h"

#include <cuda_runtime.h>

#include <cfloat>

#include "aero/model/kernels/launch.h"

namespace slipstream::aero::ball_query_kernels {
namespace {

constexpr int kThreads = 128;     // queries per block
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

// (squared distance, index) order: the nearer first, on a tie the lower index.
__device__ __forceinline__ bool after(float da, int ia, float db, int ib) {
  return da > db || (da == db && ia > ib);
}

// Restores the max-heap property below `pos` in heap[0, size).
__device__ __forceinline__ void sift_down(float* d2, int* idx, int pos, int size) {
  const float d = d2[pos];
  const int i = idx[pos];
  for (;;) {
    int child = 2 * pos + 1;
    if (child >= size) break;
    if (child + 1 < size && after(d2[child + 1], idx[child + 1], d2[child], idx[child])) ++child;
    if (!after(d2[child], idx[child], d, i)) break;
    d2[pos] = d2[child];
    idx[pos] = idx[child];
    pos = child;
  }
  d2[pos] = d;
  idx[pos] = i;
}

// A query's K best within the radius so far: a max-heap on (squared
// distance, index), so admitting a point costs log K whatever the order the
// cells are visited in.
template <int KMAX>
struct Best {
  float d2[KMAX];
  int idx[KMAX];
  int count = 0;

  __device__ void offer(float d, int id, int k) {
    if (count < k) {  // sift up
      int pos = count++;
      while (pos > 0 && after(d, id, d2[(pos - 1) / 2], idx[(pos - 1) / 2])) {
        d2[pos] = d2[(pos - 1) / 2];
        idx[pos] = idx[(pos - 1) / 2];
        pos = (pos - 1) / 2;
      }
      d2[pos] = d;
      idx[pos] = id;
    } else if (after(d2[0], idx[0], d, id)) {  // nearer than the root: replace it
      d2[0] = d;
      idx[0] = id;
      sift_down(d2, idx, 0, k);
    }
  }

  __device__ void sort() {  // heapsort: ascending
    for (int end = count - 1; end > 0; --end) {
      const float d = d2[0];
      const int i = idx[0];
      d2[0] = d2[end];
      idx[0] = idx[end];
      d2[end] = d;
      idx[end] = i;
      sift_down(d2, idx, 0, end);
    }
  }
};

template <int KMAX>
__global__ void __launch_bounds__(kThreads) search_kernel(Search s) {
  const int64_t batch = blockIdx.y;
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= s.m) return;
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
  Best<KMAX> best;

  const auto visit = [&](int64_t first_cell, int64_t last_cell) {  // cells [first, last]
    const int64_t end = start[last_cell + 1];
    for (int64_t j = start[first_cell]; j < end; ++j) {
      const float4 p = pts[j];
      const float dx = q[0] - p.x, dy = q[1] - p.y, dz = q[2] - p.z;
      // Rounded as the reference computes it (no fused multiply-adds).
      const float d2 =
          __fadd_rn(__fadd_rn(__fmul_rn(dx, dx), __fmul_rn(dy, dy)), __fmul_rn(dz, dz));
      if (best.count == k && d2 > best.d2[0]) continue;
      if (!(sqrtf(d2) <= radius)) continue;
      best.offer(d2, __float_as_int(p.w), k);
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
    if (best.count == k && bound > 0.f && best.d2[0] < bound * bound) break;
  }

  best.sort();
  for (int i = 0; i < s.num_scales; ++i) {
    const ScaleOut& o = s.scales[i];
    int64_t* out_i = o.indices + (batch * s.m + qi) * o.k;
    float* out_p = o.neighbors + (batch * s.m + qi) * o.k * 3;
    const float* src = s.points + batch * s.n * 3;
    for (int j = 0; j < o.k; ++j) {
      const bool found = j < best.count && sqrtf(best.d2[j]) <= o.radius;
      const int idx = found ? best.idx[j] : 0;
      out_i[j] = idx;
      out_p[3 * j] = found ? src[3 * idx] : 0.f;
      out_p[3 * j + 1] = found ? src[3 * idx + 1] : 0.f;
      out_p[3 * j + 2] = found ? src[3 * idx + 2] : 0.f;
    }
  }
}

template <int KMAX>
void launch(const Search& s, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((s.m + kThreads - 1) / kThreads),
                  static_cast<unsigned>(s.b));
  search_kernel<KMAX><<<grid, kThreads, 0, stream>>>(s);
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
  if (k <= 8) {
    launch<8>(s, st);
  } else if (k <= 16) {
    launch<16>(s, st);
  } else if (k <= 32) {
    launch<32>(s, st);
  } else if (k <= 64) {
    launch<64>(s, st);
  } else {
    launch<kMaxNeighbors>(s, st);
  }
}

}  // namespace slipstream::aero::ball_query_kernels
