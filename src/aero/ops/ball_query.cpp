#include "aero/ops/ball_query.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

#ifdef SLIPSTREAM_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "aero/kernels/ball_query_kernels.h"
#endif

namespace slipstream::aero {
namespace {

void check_points(const at::Tensor& points) {
  TORCH_CHECK(points.dim() == 3 && points.size(-1) == 3,
              "ball query: expected points (B, N, 3), got ", points.sizes());
  if (points.is_cpu()) {
    TORCH_CHECK(at::isfinite(points).all().item<bool>(),
                "ball query: non-finite (NaN or Inf) point coordinates");
  }
}

void check_queries(const at::Tensor& points, const at::Tensor& queries,
                   const std::vector<BallQueryScale>& scales) {
  TORCH_CHECK(points.dim() == 3 && points.size(-1) == 3 && queries.dim() == 3 &&
                  queries.size(-1) == 3 && points.size(0) == queries.size(0),
              "ball query: expected points (B, N, 3) and queries (B, M, 3), got ", points.sizes(),
              " and ", queries.sizes());
  TORCH_CHECK(!scales.empty(), "ball query: no scales asked for");
  for (const auto& s : scales) {
    TORCH_CHECK(s.k >= 1 && s.k <= points.size(1), "ball query: ", s.k,
                " neighbours asked of each query, but there are ", points.size(1),
                " points; use at least as many points as neighbours");
    TORCH_CHECK(s.radius > 0, "ball query: radius must be > 0, got ", s.radius);
  }
  if (queries.is_cpu()) {
    TORCH_CHECK(at::isfinite(queries).all().item<bool>(),
                "ball query: non-finite (NaN or Inf) point coordinates");
  }
}

int64_t largest_k(const std::vector<BallQueryScale>& scales) {
  int64_t k = 0;
  for (const auto& s : scales) k = std::max(k, s.k);
  return k;
}

// The reference path: the k nearest points of every query, ascending (ATen's
// top-k order among equal distances), in query chunks of bounded size.
struct Nearest {
  at::Tensor dist;     // (B, M, k)
  at::Tensor indices;  // (B, M, k) int64
};

Nearest nearest(const at::Tensor& points, const at::Tensor& queries, int64_t k,
                int64_t max_elements) {
  const int64_t b = points.size(0), n = points.size(1), m = queries.size(1);
  const int64_t chunk = std::max<int64_t>(1, max_elements / std::max<int64_t>(1, b * n));
  std::vector<at::Tensor> dists, indices;
  for (int64_t begin = 0; begin < m; begin += chunk) {
    const auto q = queries.narrow(1, begin, std::min(chunk, m - begin));
    // (B, Mc, N), Euclidean without the matmul shortcut (as the reference).
    const auto d = at::cdist(q, points, 2.0, /*compute_mode=*/2);
    auto [values, idx] = at::topk(d, k, /*dim=*/2, /*largest=*/false, /*sorted=*/true);
    dists.push_back(values);
    indices.push_back(idx);
  }
  return {at::cat(dists, 1), at::cat(indices, 1)};
}

// The first k of `nn` within the radius, the rest index 0 and (0, 0, 0).
BallQueryResult within(const at::Tensor& points, const Nearest& nn, double radius, int64_t k) {
  const int64_t b = points.size(0), n = points.size(1), m = nn.indices.size(1);
  const auto inside = nn.dist.narrow(2, 0, k) <= radius;
  const auto indices =
      at::where(inside, nn.indices.narrow(2, 0, k), at::zeros({}, nn.indices.options()));
  const auto gathered = at::gather(points.unsqueeze(1).expand({b, m, n, 3}), 2,
                                   indices.unsqueeze(-1).expand({b, m, k, 3}));
  return {indices, at::where(inside.unsqueeze(-1), gathered, at::zeros({}, points.options()))};
}

}  // namespace

#ifdef SLIPSTREAM_WITH_CUDA
// The grid search's levels (kernels/ball_query_kernels.h); every step stays
// on the device.
struct BallQueryIndex::Grids {
  at::Tensor points, lo, hi;  // points contiguous; lo, hi (B, 3): the box
  std::vector<ball_query_kernels::Grid> grids;
  std::vector<at::Tensor> sorted, cell_start;  // per level: pack's output, (B, cells + 1)
  size_t order_level = 0;                      // the level of about one point a cell
  at::Tensor point_order;  // (B, N) int64: the points in that level's cell order
};
#else
struct BallQueryIndex::Grids {};
#endif

BallQueryIndex::BallQueryIndex(const at::Tensor& points, int64_t points_per_cell)
    : points_(points) {
  check_points(points);
#ifdef SLIPSTREAM_WITH_CUDA
  if (!uses_ball_query_kernel(points, points, 1)) return;
  namespace kq = ball_query_kernels;
  const c10::cuda::CUDAGuard guard(points.device());
  void* stream = at::cuda::getCurrentCUDAStream(points.get_device()).stream();
  auto g = std::make_unique<Grids>();
  g->points = points.contiguous();
  const auto& p = g->points;
  const int64_t b = p.size(0), n = p.size(1);
  g->lo = p.amin(1).contiguous();
  g->hi = p.amax(1).contiguous();
  // The levels' cells (kernels/ball_query_kernels.h, Level): on average 1/8
  // (at most 2^25 cells), 1, 8 and 64 points a cell, each 8 times the last,
  // so every query finds one within a factor 8 of the density it wants; or
  // one level of points_per_cell (for tuning and tests).
  std::vector<int64_t> level_cells;
  if (points_per_cell > 0) {
    level_cells.push_back(std::max<int64_t>(1, n / points_per_cell));
  } else {
    level_cells = {std::min<int64_t>(8 * n, int64_t{1} << 25), n, std::max<int64_t>(1, n / 8),
                   std::max<int64_t>(1, n / 64)};
  }
  TORCH_CHECK(level_cells.size() <= static_cast<size_t>(kq::kMaxLevels),
              "ball query: too many grid levels");
  const auto int32 = p.options().dtype(at::kInt);
  for (size_t l = 0; l < level_cells.size(); ++l) {
    const int64_t cells = level_cells[l];
    const kq::Grid grid{g->lo.data_ptr<float>(), g->hi.data_ptr<float>(), cells};
    auto point_cells = at::empty({b, n}, int32);
    kq::cell_of(grid, p.data_ptr<float>(), b, n, point_cells.data_ptr<int32_t>(), stream);
    // (The optional<bool> spelled out: a plain `true` would pick the
    // (dim, descending) overload.)
    const auto [sorted_cells, order] =
        at::sort(point_cells, c10::optional<bool>(true), /*dim=*/1, /*descending=*/false);
    const auto cell_ids = at::arange(cells + 1, int32).expand({b, cells + 1});
    g->cell_start.push_back(at::searchsorted(sorted_cells, cell_ids.contiguous()).contiguous());
    auto sorted = at::empty({b, n, 4}, p.options());
    const auto order64 = order.contiguous();
    kq::pack(p.data_ptr<float>(), order64.data_ptr<int64_t>(), b, n, sorted.data_ptr<float>(),
             stream);
    g->grids.push_back(grid);
    g->sorted.push_back(sorted);
    // The queries are searched in the cell order of the level of about one
    // point a cell (the last such), for locality; the points' own order
    // there serves queries that are the points themselves.
    if (l == 0 || cells == n) {
      g->order_level = l;
      g->point_order = order64;
    }
  }
  grids_ = std::move(g);
#else
  (void)points_per_cell;  // the reference path has no grid
#endif
}

BallQueryIndex::~BallQueryIndex() = default;

std::vector<BallQueryResult> BallQueryIndex::query(const at::Tensor& queries,
                                                   const std::vector<BallQueryScale>& scales,
                                                   int64_t max_elements) const {
  const auto& points = points_;
  check_queries(points, queries, scales);
#ifdef SLIPSTREAM_WITH_CUDA
  if (grids_ != nullptr && uses_ball_query_kernel(points, queries, largest_k(scales)) &&
      scales.size() <= static_cast<size_t>(ball_query_kernels::kMaxScales)) {
    namespace kq = ball_query_kernels;
    const Grids& g = *grids_;
    const c10::cuda::CUDAGuard guard(points.device());
    void* stream = at::cuda::getCurrentCUDAStream(points.get_device()).stream();
    const auto& p = g.points;
    const auto q = queries.contiguous();
    const int64_t b = p.size(0), n = p.size(1), m = q.size(1);
    at::Tensor query_order = g.point_order;
    if (q.data_ptr() != p.data_ptr() || m != n) {
      auto query_cells = at::empty({b, m}, p.options().dtype(at::kInt));
      kq::cell_of(g.grids[g.order_level], q.data_ptr<float>(), b, m,
                  query_cells.data_ptr<int32_t>(), stream);
      query_order = std::get<1>(at::sort(query_cells, c10::optional<bool>(false), /*dim=*/1,
                                         /*descending=*/false))
                        .contiguous();
    }
    kq::Search s;
    for (size_t l = 0; l < g.grids.size(); ++l) {
      s.levels[s.num_levels++] = {g.grids[l], g.sorted[l].data_ptr<float>(),
                                  g.cell_start[l].data_ptr<int64_t>()};
    }
    // Each query takes the coarsest level with at most K/64 points in its
    // cell: the fastest of K/16 .. K/128 in ball_query_bench.
    s.max_cell_points = static_cast<int>(std::max<int64_t>(1, largest_k(scales) / 64));
    s.points = p.data_ptr<float>();
    s.queries = q.data_ptr<float>();
    s.query_order = query_order.data_ptr<int64_t>();
    s.b = b;
    s.n = n;
    s.m = m;
    std::vector<BallQueryResult> out;
    for (const auto& sc : scales) {
      out.push_back({at::empty({b, m, sc.k}, p.options().dtype(at::kLong)),
                     at::empty({b, m, sc.k, 3}, p.options())});
      auto& o = s.scales[s.num_scales++];
      o.radius = static_cast<float>(sc.radius);
      o.k = static_cast<int>(sc.k);
      o.indices = out.back().indices.data_ptr<int64_t>();
      o.neighbors = out.back().neighbors.data_ptr<float>();
    }
    kq::search(s, stream);
    return out;
  }
#endif
  const auto nn = nearest(points, queries, largest_k(scales), max_elements);
  std::vector<BallQueryResult> out;
  out.reserve(scales.size());
  for (const auto& s : scales) out.push_back(within(points, nn, s.radius, s.k));
  return out;
}

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

std::vector<BallQueryResult> ball_query_scales(const at::Tensor& points, const at::Tensor& queries,
                                               const std::vector<BallQueryScale>& scales,
                                               int64_t max_elements, int64_t points_per_cell) {
  check_queries(points, queries, scales);  // before the grids are built
  return BallQueryIndex(points, points_per_cell).query(queries, scales, max_elements);
}

BallQueryResult ball_query(const at::Tensor& points, const at::Tensor& queries, double radius,
                           int64_t k, int64_t max_elements) {
  return ball_query_scales(points, queries, {{radius, k}}, max_elements).front();
}

}  // namespace slipstream::aero
