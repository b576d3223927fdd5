#include "aero/model/ball_query.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

#ifdef SLIPSTREAM_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "aero/model/kernels/ball_query_kernels.h"
#endif

namespace slipstream::aero {

bool uses_ball_query_kernel(const at::Tensor& points, const at::Tensor& queries, int64_t k) {
#ifdef SLIPSTREAM_WITH_CUDA
  return points.is_cuda() && queries.device() == points.device() &&
         points.scalar_type() == at::kFloat && queries.scalar_type() == at::kFloat &&
         k <= ball_query_kernels::kMaxNeighbors && points.size(1) < (int64_t{1} << 31);
#else
  (void)points, (void)queries, (void)k;
  return false;
#endif
}

BallQueryResult ball_query(const at::Tensor& points, const at::Tensor& queries, double radius,
                           int64_t k, int64_t max_elements) {
  TORCH_CHECK(points.dim() == 3 && points.size(-1) == 3 && queries.dim() == 3 &&
                  queries.size(-1) == 3 && points.size(0) == queries.size(0),
              "ball query: expected points (B, N, 3) and queries (B, M, 3), got ", points.sizes(),
              " and ", queries.sizes());
  TORCH_CHECK(k >= 1 && k <= points.size(1), "ball query: ", k,
              " neighbours asked of each query, but there are ", points.size(1),
              " points; use at least as many points as neighbours");
  TORCH_CHECK(radius > 0, "ball query: radius must be > 0, got ", radius);
  if (points.is_cpu()) {
    TORCH_CHECK(at::isfinite(points).all().item<bool>() && at::isfinite(queries).all().item<bool>(),
                "ball query: non-finite (NaN or Inf) point coordinates");
  }
  const int64_t b = points.size(0), n = points.size(1), m = queries.size(1);
#ifdef SLIPSTREAM_WITH_CUDA
  if (uses_ball_query_kernel(points, queries, k)) {
    const c10::cuda::CUDAGuard guard(points.device());
    const auto p = points.contiguous(), q = queries.contiguous();
    auto indices = at::empty({b, m, k}, p.options().dtype(at::kLong));
    auto neighbors = at::empty({b, m, k, 3}, p.options());
    ball_query_kernels::ball_query(p.data_ptr<float>(), q.data_ptr<float>(), b, n, m,
                                   static_cast<float>(radius), static_cast<int>(k),
                                   indices.data_ptr<int64_t>(), neighbors.data_ptr<float>(),
                                   at::cuda::getCurrentCUDAStream(p.get_device()).stream());
    return {indices, neighbors};
  }
#endif
  const int64_t chunk = std::max<int64_t>(1, max_elements / std::max<int64_t>(1, b * n));
  std::vector<at::Tensor> index_parts, point_parts;
  for (int64_t begin = 0; begin < m; begin += chunk) {
    const auto q = queries.narrow(1, begin, std::min(chunk, m - begin));
    // (B, Mc, N), Euclidean without the matmul shortcut (as the reference).
    const auto dists = at::cdist(q, points, 2.0, /*compute_mode=*/2);
    auto [values, indices] = at::topk(dists, k, /*dim=*/2, /*largest=*/false, /*sorted=*/true);
    const auto inside = values <= radius;
    indices = at::where(inside, indices, at::zeros({}, indices.options()));
    const auto gathered = at::gather(points.unsqueeze(1).expand({b, q.size(1), n, 3}), 2,
                                     indices.unsqueeze(-1).expand({b, q.size(1), k, 3}));
    point_parts.push_back(
        at::where(inside.unsqueeze(-1), gathered, at::zeros({}, points.options())));
    index_parts.push_back(indices);
  }
  return {at::cat(index_parts, 1), at::cat(point_parts, 1)};
}

}  // namespace slipstream::aero
