// The slice kernels of physics attention: see slice_kernels.h for the maths
// and layouts. Every kernel owns one (batch, head) per block and a run of
// points, and recomputes the points x slices weights from x instead of
// reading them; they never reach global memory. All of them keep the
// weights in registers: tensor-core products whose accumulators are turned
// into weights in place and fed back as the next product's operand.
// Two shapes of work:
//   row ownership (lse, expand, backward): a warp owns 16-point tiles and
//     runs every chunk of 16 slices on them, reading its own rows;
//   column ownership (reduce, weight_grad): a warp owns chunks of slices
//     and sums over all the block's points, which the block reads once into
//     a cp.async pipeline of 64-point stages in shared memory.
// sm80_forward.cu and sm80_backward.cu hold the kernels on mma.sync
// m16n8k16, which every GPU since Ampere has; sm90_forward.cu and
// sm90_backward.cu their wgmma forms for Hopper, where four warps' tiles
// share each B operand, read once from shared memory (stages.cuh, tiles.cuh
// and wg_tiles.cuh: the pieces they share). This file checks a problem and
// picks the kernels that run it.
#include "aero/kernels/common/launch.h"
#include "aero/kernels/slice/launchers.h"
#include "aero/kernels/slice/slice_kernels.h"
#include "aero/kernels/slice/stages.cuh"
#include "aero/kernels/slice/tiles.cuh"
#include "aero/kernels/slice/wg_tiles.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace slipstream::aero::slice_kernels {
namespace {

using detail::BackwardArgs;
using detail::bf16;

void check_problem(const Problem& p) {
  if (!supported(p.dim, p.slices)) {
    throw std::invalid_argument("slice kernels: unsupported dim_head " + std::to_string(p.dim) +
                                " / slices " + std::to_string(p.slices));
  }
  if (p.batch * p.heads > 65535) throw std::invalid_argument("slice kernels: too many heads");
}

// The row kernels write whole 16-byte pieces of their outputs' rows.
void check_aligned(const void* out, const char* what) {
  if (reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    throw std::invalid_argument(std::string("slice kernels: ") + what + " must be 16-byte aligned");
  }
}

// How backward's callers get the slice weights' gradient (set_weight_grad_mode).
std::atomic<WeightGrad> weight_grad{WeightGrad::gemm};
// The wgmma kernels run on Hopper unless set_mma_only asks for the mma.sync
// ones (as on other GPUs), for measurements against them.
std::atomic<bool> mma_only_kernels{false};

bool wgmma_kernels() { return !mma_only_kernels.load() && kernels::hopper(); }

// The forward row kernels' wgmma forms need the slices in whole batches.
bool use_wg_rows(const Problem& p, int batch) { return p.slices % batch == 0 && wgmma_kernels(); }

template <int D>
void reduce_d(const Problem& p, const void* y, float* acc, float* colsum, bool compute_lse) {
  if (p.points == 0) return;
  if (compute_lse && use_wg_rows(p, 2 * detail::kWgSlices)) {
    detail::launch_lse_wg<D>(p);
  } else if (compute_lse) {
    detail::launch_lse<D>(p);
  }
  const auto* y_b = static_cast<const bf16*>(y);
  // The wgmma reduce above head size 32 only: below it the mma.sync one is
  // the faster.
  if constexpr (D > 32) {
    if (use_wg_rows(p, detail::kWgReduceSlices)) {
      detail::launch_reduce_wg<D>(p, y_b, acc, colsum);
      return;
    }
  }
  detail::launch_reduce<D>(p, y_b, acc, colsum);
}

template <int D>
void expand_d(const Problem& p, const void* z, void* out) {
  if (p.points == 0) return;
  const auto* z_b = static_cast<const bf16*>(z);
  auto* out_b = static_cast<bf16*>(out);
  if (use_wg_rows(p, detail::kWgSlices)) {
    detail::launch_expand_wg<D>(p, z_b, out_b);
  } else {
    detail::launch_expand<D>(p, z_b, out_b);
  }
}

template <int D, bool kDeslice>
void backward_dd(const Problem& p, const BackwardArgs& a) {
  if (a.dlogits != nullptr) {
    // Only the 32-slice forms above D 32 write them (writes_dlogits: G %
    // 32 == 0), in place of the weight-gradient kernel, for a GEMM: in
    // pairs of batches where those divide G (kPipe, the faster form: one
    // block of 8 warps an SM, up to 255 registers a thread), else one
    // block of 12 warps.
    if constexpr (D > 32) {
      if (p.slices % 64 == 0) {
        detail::launch_backward_wg<D, kDeslice, 32, 8, true, true>(p, a);
      } else {
        detail::launch_backward_wg<D, kDeslice, 32, 12, true, false>(p, a);
      }
    } else {
      throw std::invalid_argument("slice kernels: no dlogits at head size 32 and below");
    }
    return;
  }
  if (wgmma_kernels()) {
    // Batches of 32 slices where they divide G. Above D 32 their registers
    // need blocks of 12 warps, one an SM; at D 32 and below two blocks of 8
    // fit.
    if (p.slices % 32 != 0) {
      detail::launch_backward_wg<D, kDeslice, 16, 8, false, false>(p, a);
    } else if constexpr (D > 32) {
      detail::launch_backward_wg<D, kDeslice, 32, 12, false, false>(p, a);
    } else {
      detail::launch_backward_wg<D, kDeslice, 32, 8, false, false>(p, a);
    }
  } else {
    detail::launch_backward<D, kDeslice>(p, a);
  }
  // The wgmma weight gradient at head size 32 and below only: above it,
  // one block an SM, the mma.sync one is the faster.
  if constexpr (D <= 32) {
    if (use_wg_rows(p, detail::kWgReduceSlices)) {
      detail::launch_weight_grad_wg<D, kDeslice>(p, a);
      return;
    }
  }
  detail::launch_weight_grad<D, kDeslice>(p, a);
}

// Calls f.template operator()<D>() for the head size of p.
template <typename F>
void with_dim(const Problem& p, F&& f) {
  switch (p.dim) {
    case 16:
      f(std::integral_constant<int, 16>{});
      break;
    case 32:
      f(std::integral_constant<int, 32>{});
      break;
    case 56:
      f(std::integral_constant<int, 56>{});
      break;
    default:
      f(std::integral_constant<int, 64>{});
      break;
  }
}

}  // namespace

bool supported(int64_t dim, int64_t slices) {
  return (dim == 16 || dim == 32 || dim == 56 || dim == 64) && slices >= 16 &&
         slices <= detail::kMaxSlices && slices % 16 == 0;
}

void reduce(const Problem& p, const void* y, float* acc, float* colsum, bool compute_lse) {
  check_problem(p);
  with_dim(p, [&](auto d) { reduce_d<decltype(d)::value>(p, y, acc, colsum, compute_lse); });
}

void expand(const Problem& p, const void* z, void* out) {
  check_problem(p);
  check_aligned(out, "expand's out");
  with_dim(p, [&](auto d) { expand_d<decltype(d)::value>(p, z, out); });
}

WeightGrad weight_grad_mode() { return weight_grad.load(); }

void set_weight_grad_mode(WeightGrad mode) { weight_grad = mode; }

void set_mma_only(bool on) { mma_only_kernels = on; }

bool mma_only() { return mma_only_kernels.load(); }

bool writes_dlogits(const Problem& p) {
  return weight_grad_mode() == WeightGrad::gemm && p.dim > 32 && p.dim <= 64 &&
         supported(p.dim, p.slices) && p.slices % 32 == 0 && wgmma_kernels();
}

void backward(const Problem& p, const void* fx, const void* gout, const void* os, const void* gs,
              const float* gnorm, void* grad_x, void* grad_fx, float* grad_ws, float* grad_bias,
              float* tau_acc, float* dot, void* dlogits, void* x_ext) {
  check_problem(p);
  check_aligned(grad_x, "backward's grad_x");
  check_aligned(grad_fx, "backward's grad_fx");
  if ((gout == nullptr) != (os == nullptr)) {
    throw std::invalid_argument("slice kernels: backward needs gout and os both or neither");
  }
  if ((dlogits == nullptr) != (x_ext == nullptr)) {
    throw std::invalid_argument("slice kernels: backward needs dlogits and x_ext both or neither");
  }
  if (dlogits != nullptr && !writes_dlogits(p)) {
    throw std::invalid_argument(
        "slice kernels: backward given dlogits where writes_dlogits is false");
  }
  if (p.points == 0) return;
  const BackwardArgs a{static_cast<const bf16*>(fx),
                       static_cast<const bf16*>(gout),
                       static_cast<const bf16*>(os),
                       static_cast<const bf16*>(gs),
                       gnorm,
                       static_cast<bf16*>(grad_x),
                       static_cast<bf16*>(grad_fx),
                       grad_ws,
                       grad_bias,
                       tau_acc,
                       dot,
                       static_cast<bf16*>(dlogits),
                       static_cast<bf16*>(x_ext)};
  with_dim(p, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    if (gout == nullptr) {
      backward_dd<kD, false>(p, a);
    } else {
      backward_dd<kD, true>(p, a);
    }
  });
}

}  // namespace slipstream::aero::slice_kernels
