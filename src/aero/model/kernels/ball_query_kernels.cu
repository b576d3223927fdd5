#include "aero/model/kernels/ball_query_kernels.h"

#include <cuda_runtime.h>

#include <cfloat>

#include "aero/model/kernels/launch.h"

namespace slipstream::aero::ball_query_kernels {
namespace {

constexpr int kThreads = 128;  // queries per block
constexpr int kTile = 1024;    // points staged in shared memory at a time

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

// One thread per query. The K best points in the radius found so far are a
// max-heap on (squared distance, index), so admitting a point costs log K;
// the scan visits indices in increasing order, so a later point of equal
// distance never displaces an earlier one. A heapsort orders them at the end.
template <int KMAX>
__global__ void __launch_bounds__(kThreads)
    ball_query_kernel(const float* __restrict__ points, const float* __restrict__ queries,
                      int64_t n, int64_t m, float radius, int k, int64_t* __restrict__ indices,
                      float* __restrict__ neighbors) {
  __shared__ float tile[kTile * 3];
  const int64_t batch = blockIdx.y;
  const int64_t q = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const float* pts = points + batch * n * 3;
  const bool active = q < m;
  float qx = 0.f, qy = 0.f, qz = 0.f;
  if (active) {
    const float* p = queries + (batch * m + q) * 3;
    qx = p[0];
    qy = p[1];
    qz = p[2];
  }
  float heap_d2[KMAX];
  int heap_i[KMAX];
  int count = 0;
  float worst = FLT_MAX;  // the admission bound: the K-th distance once full
  for (int64_t start = 0; start < n; start += kTile) {
    const int tile_n = static_cast<int>(n - start < kTile ? n - start : kTile);
    __syncthreads();
    for (int i = threadIdx.x; i < tile_n * 3; i += kThreads) tile[i] = pts[start * 3 + i];
    __syncthreads();
    if (!active) continue;
    for (int j = 0; j < tile_n; ++j) {
      const float dx = qx - tile[3 * j], dy = qy - tile[3 * j + 1], dz = qz - tile[3 * j + 2];
      // Rounded as the reference computes it (no fused multiply-adds).
      const float d2 =
          __fadd_rn(__fadd_rn(__fmul_rn(dx, dx), __fmul_rn(dy, dy)), __fmul_rn(dz, dz));
      if (!(d2 < worst) || !(sqrtf(d2) <= radius)) continue;
      const int id = static_cast<int>(start + j);
      if (count < k) {  // sift up
        int pos = count++;
        while (pos > 0 && after(d2, id, heap_d2[(pos - 1) / 2], heap_i[(pos - 1) / 2])) {
          heap_d2[pos] = heap_d2[(pos - 1) / 2];
          heap_i[pos] = heap_i[(pos - 1) / 2];
          pos = (pos - 1) / 2;
        }
        heap_d2[pos] = d2;
        heap_i[pos] = id;
      } else {  // d2 < the root's: replace it
        heap_d2[0] = d2;
        heap_i[0] = id;
        sift_down(heap_d2, heap_i, 0, k);
      }
      if (count == k) worst = heap_d2[0];
    }
  }
  if (!active) return;
  for (int end = count - 1; end > 0; --end) {  // heapsort: ascending
    const float d = heap_d2[0];
    const int i = heap_i[0];
    heap_d2[0] = heap_d2[end];
    heap_i[0] = heap_i[end];
    heap_d2[end] = d;
    heap_i[end] = i;
    sift_down(heap_d2, heap_i, 0, end);
  }
  int64_t* out_i = indices + (batch * m + q) * k;
  float* out_p = neighbors + (batch * m + q) * k * 3;
  for (int s = 0; s < k; ++s) {
    const bool found = s < count;
    const int idx = found ? heap_i[s] : 0;
    out_i[s] = idx;
    out_p[3 * s] = found ? pts[3 * idx] : 0.f;
    out_p[3 * s + 1] = found ? pts[3 * idx + 1] : 0.f;
    out_p[3 * s + 2] = found ? pts[3 * idx + 2] : 0.f;
  }
}

template <int KMAX>
void launch(const float* points, const float* queries, int64_t b, int64_t n, int64_t m,
            float radius, int k, int64_t* indices, float* neighbors, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((m + kThreads - 1) / kThreads), static_cast<unsigned>(b));
  ball_query_kernel<KMAX>
      <<<grid, kThreads, 0, stream>>>(points, queries, n, m, radius, k, indices, neighbors);
  kernels::check_launch("ball query", "ball_query_kernel");
}

}  // namespace

void ball_query(const float* points, const float* queries, int64_t b, int64_t n, int64_t m,
                float radius, int k, int64_t* indices, float* neighbors, void* stream) {
  if (b == 0 || m == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (k <= 8) {
    launch<8>(points, queries, b, n, m, radius, k, indices, neighbors, s);
  } else if (k <= 16) {
    launch<16>(points, queries, b, n, m, radius, k, indices, neighbors, s);
  } else if (k <= 32) {
    launch<32>(points, queries, b, n, m, radius, k, indices, neighbors, s);
  } else if (k <= 64) {
    launch<64>(points, queries, b, n, m, radius, k, indices, neighbors, s);
  } else {
    launch<kMaxNeighbors>(points, queries, b, n, m, radius, k, indices, neighbors, s);
  }
}

}  // namespace slipstream::aero::ball_query_kernels
