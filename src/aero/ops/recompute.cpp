#include "aero/ops/recompute.h"

#include "aero/ops/saved_address.h"
#include "core/device/device.h"

#include <torch/autograd.h>
#include <torch/torch.h>

#ifdef SLIPSTREAM_WITH_CUDA
#include <ATen/autocast_mode.h>
#endif

namespace slipstream::aero {

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::kNone;
  if (name == "attention") return Recompute::kAttention;
  if (name == "block") return Recompute::kBlock;
  TORCH_CHECK(false, "config: training.recompute '", name,
              "' is not one of none, attention, block");
  return Recompute::kNone;  // not reached
}

std::string to_string(Recompute mode) {
  switch (mode) {
    case Recompute::kAttention:
      return "attention";
    case Recompute::kBlock:
      return "block";
    default:
      return "none";
  }
}

namespace {

bool autocast_on() {
#ifdef SLIPSTREAM_WITH_CUDA
  return at::autocast::is_autocast_enabled(at::kCUDA);
#else
  return false;
#endif
}

// fn over x, `chunk` points at a time along dim 1 (all at once when 0).
torch::Tensor run_in_chunks(Recomputable& fn, const torch::Tensor& x, int64_t chunk) {
  const int64_t n = x.size(1);
  if (chunk <= 0 || chunk >= n) return fn.run(x);
  torch::Tensor out;
  for (int64_t s = 0; s < n; s += chunk) {
    const int64_t len = std::min(chunk, n - s);
    const auto y = fn.run(x.narrow(1, s, len));
    if (!out.defined()) {
      auto sizes = y.sizes().vec();
      sizes[1] = n;
      out = torch::empty(sizes, y.options());
    }
    out.narrow(1, s, len).copy_(y);
  }
  return out;
}

// second's backward from its input `mid` (no grad) and its output's
// gradient, `chunk` points at a time: returns d loss / d mid, accumulating
// second's parameter gradients.
torch::Tensor pointwise_backward(Recomputable& second, const torch::Tensor& mid,
                                 const torch::Tensor& grad, int64_t chunk) {
  const int64_t n = mid.size(1);
  const int64_t step = chunk <= 0 || chunk >= n ? n : chunk;
  torch::Tensor grad_mid = step == n ? torch::Tensor() : torch::empty_like(mid);
  for (int64_t s = 0; s < n; s += step) {
    const int64_t len = std::min(step, n - s);
    auto xc = (step == n ? mid : mid.narrow(1, s, len)).detach().requires_grad_(true);
    const auto y = second.run(xc);
    torch::autograd::backward({y}, {step == n ? grad : grad.narrow(1, s, len)});
    if (step == n) {
      grad_mid = xc.grad();
    } else {
      grad_mid.narrow(1, s, len).copy_(xc.grad());
    }
  }
  return grad_mid;
}

// The backward of `fn` run with grad from leaves made of x and side (when
// defined): their gradients, fn's parameter gradients accumulated.
std::pair<torch::Tensor, torch::Tensor> backward_with_side(Recomputable& fn, const torch::Tensor& x,
                                                           const torch::Tensor& side,
                                                           const torch::Tensor& grad) {
  const auto xl = x.detach().requires_grad_(true);
  const auto sl = side.detach().requires_grad_(true);
  torch::autograd::backward({fn.run_with(xl, sl)}, {grad});
  return {xl.grad(), sl.grad()};
}

// An autograd function's inputs must all be defined tensors (LibTorch 1.13
// records each one's device): without a side input, an empty one stands in
// and `with_side` is false.
torch::Tensor side_or_empty(const torch::Tensor& side, const torch::Tensor& x) {
  return side.defined() ? side : torch::empty({0}, x.options());
}

struct RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
  // `anchor` is an empty tensor that needs grad, so that the output needs
  // grad (and the backward runs, for fn's parameters) even when x does not.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& side, bool with_side,
                               const torch::Tensor& anchor, int64_t fn_address, int64_t chunk) {
    (void)anchor;
    ctx->saved_data["fn"] = fn_address;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["autocast"] = autocast_on();
    ctx->saved_data["side"] = with_side;
    auto& fn = *object_at<Recomputable>(fn_address);
    if (with_side) {
      ctx->save_for_backward({x, side});
      return fn.run_with(x, side);
    }
    ctx->save_for_backward({x});
    return run_in_chunks(fn, x, chunk);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    torch::autograd::variable_list out(6);
    const auto grad = grads[0];
    if (!grad.defined()) return out;
    auto* fn = object_at<Recomputable>(ctx->saved_data["fn"].toInt());
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    AutocastGuard autocast(x.device(), ctx->saved_data["autocast"].toBool());
    torch::AutoGradMode enable(true);
    if (ctx->saved_data["side"].toBool()) {
      std::tie(out[0], out[1]) = backward_with_side(*fn, x, saved[1], grad);
    } else {
      out[0] = pointwise_backward(*fn, x, grad, ctx->saved_data["chunk"].toInt());
    }
    return out;
  }
};

struct RecomputePairFunction : public torch::autograd::Function<RecomputePairFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& side, bool with_side,
                               const torch::Tensor& anchor, int64_t first, int64_t second,
                               int64_t chunk) {
    (void)anchor;
    ctx->saved_data["first"] = first;
    ctx->saved_data["second"] = second;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["autocast"] = autocast_on();
    ctx->saved_data["side"] = with_side;
    ctx->save_for_backward(with_side ? torch::autograd::variable_list{x, side}
                                     : torch::autograd::variable_list{x});
    const auto mid =
        object_at<Recomputable>(first)->run_with(x, with_side ? side : torch::Tensor());
    return run_in_chunks(*object_at<Recomputable>(second), mid, chunk);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    torch::autograd::variable_list out(7);
    if (!grads[0].defined()) return out;
    auto* first = object_at<Recomputable>(ctx->saved_data["first"].toInt());
    auto* second = object_at<Recomputable>(ctx->saved_data["second"].toInt());
    const auto saved = ctx->get_saved_variables();
    const auto x = saved[0].detach().requires_grad_(true);
    const bool with_side = ctx->saved_data["side"].toBool();
    const auto side = with_side ? saved[1].detach().requires_grad_(true) : torch::Tensor();
    AutocastGuard autocast(x.device(), ctx->saved_data["autocast"].toBool());
    torch::AutoGradMode enable(true);
    const auto mid = first->run_with(x, side);
    const auto grad_mid =
        pointwise_backward(*second, mid.detach(), grads[0], ctx->saved_data["chunk"].toInt());
    torch::autograd::backward({mid}, {grad_mid});
    out[0] = x.grad();
    if (with_side) out[1] = side.grad();
    return out;
  }
};

}  // namespace

torch::Tensor recompute_pair(Recomputable& first, Recomputable& second, const torch::Tensor& x,
                             int64_t point_chunk, const torch::Tensor& side) {
  if (!torch::GradMode::is_enabled()) return second.run(first.run_with(x, side));
  const auto anchor = torch::empty({0}, x.options().requires_grad(true));
  return RecomputePairFunction::apply(x, side_or_empty(side, x), side.defined(), anchor,
                                      address_of(&first), address_of(&second), point_chunk);
}

torch::Tensor recompute(Recomputable& fn, const torch::Tensor& x, int64_t point_chunk,
                        const torch::Tensor& side) {
  TORCH_CHECK(!side.defined() || point_chunk == 0,
              "recompute: a sub-block with a side input runs whole (point_chunk 0)");
  if (!torch::GradMode::is_enabled()) return side.defined() ? fn.run_with(x, side) : fn.run(x);
  const auto anchor = torch::empty({0}, x.options().requires_grad(true));
  return RecomputeFunction::apply(x, side_or_empty(side, x), side.defined(), anchor,
                                  address_of(&fn), point_chunk);
}

}  // namespace slipstream::aero
