#include "aero/ops/numerics_settings.h"

#include "aero/ops/fp8_linear.h"
#include "aero/ops/lt_matmul.h"
#include "aero/ops/parameter_casts.h"

#ifdef SLIPSTREAM_WITH_CUDA
#include "aero/kernels/slice/slice_kernels.h"
#endif

namespace slipstream::aero {

NumericsSettings numerics_settings(const Config& c) {
  NumericsSettings n;
  if (!c.has("numerics")) return n;
  n.gemm = c.get<std::string>("numerics.gemm");
  check_one_of("numerics.gemm", n.gemm, {"tuned", "heuristic", "aten"});
  n.gemm_report = c.get<bool>("numerics.gemm_report");
  n.slice_kernels = c.get<std::string>("numerics.slice_kernels");
  check_one_of("numerics.slice_kernels", n.slice_kernels, {"auto", "mma"});
  n.slice_weight_grad = c.get<std::string>("numerics.slice_weight_grad");
  check_one_of("numerics.slice_weight_grad", n.slice_weight_grad, {"gemm", "kernel"});
  n.parameter_casts = c.get<std::string>("numerics.parameter_casts");
  check_one_of("numerics.parameter_casts", n.parameter_casts, {"once", "per_use"});
  // A checkpoint's config written before these keys existed has neither.
  if (c.has("numerics.fp8_amax_history")) {
    n.fp8_amax_history = c.get<int>("numerics.fp8_amax_history");
    TORCH_CHECK(n.fp8_amax_history >= 1 && n.fp8_amax_history <= 1024,
                "config: 'numerics.fp8_amax_history' is ", n.fp8_amax_history,
                ", expected 1 to 1024 steps");
  }
  if (c.has("numerics.fp8_margin")) {
    n.fp8_margin = c.get<int>("numerics.fp8_margin");
    TORCH_CHECK(n.fp8_margin >= 0 && n.fp8_margin <= 16, "config: 'numerics.fp8_margin' is ",
                n.fp8_margin, ", expected 0 to 16");
  }
  if (c.has("numerics.fp8_exclude")) {
    n.fp8_exclude = c.get<std::vector<std::string>>("numerics.fp8_exclude");
    for (const auto& name : n.fp8_exclude) (void)fp8::part_named(name);
  }
  return n;
}

void apply_numerics(const NumericsSettings& n, bool fp8) {
  fp8::Recipe recipe{n.fp8_amax_history, n.fp8_margin, {}};
  for (const auto& name : n.fp8_exclude) recipe.exclude.push_back(fp8::part_named(name));
  fp8::configure(fp8, recipe);
  lt_matmul::set_mode(n.gemm == "aten"        ? lt_matmul::Mode::aten
                      : n.gemm == "heuristic" ? lt_matmul::Mode::heuristic
                                              : lt_matmul::Mode::tuned);
  lt_matmul::set_report(n.gemm_report);
  ParameterCasts::set_enabled(n.parameter_casts == "once");
#ifdef SLIPSTREAM_WITH_CUDA
  slice_kernels::set_mma_only(n.slice_kernels == "mma");
  slice_kernels::set_weight_grad_mode(n.slice_weight_grad == "kernel"
                                          ? slice_kernels::WeightGrad::kernel
                                          : slice_kernels::WeightGrad::gemm);
#endif
}

nlohmann::json to_json(const NumericsSettings& n) {
  return {{"gemm", n.gemm},
          {"gemm_report", n.gemm_report},
          {"slice_kernels", n.slice_kernels},
          {"slice_weight_grad", n.slice_weight_grad},
          {"parameter_casts", n.parameter_casts},
          {"fp8_amax_history", n.fp8_amax_history},
          {"fp8_margin", n.fp8_margin},
          {"fp8_exclude", n.fp8_exclude}};
}

}  // namespace slipstream::aero
