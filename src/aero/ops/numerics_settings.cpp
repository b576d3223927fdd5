#include "aero/ops/numerics_settings.h"

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
  return n;
}

void apply_numerics(const NumericsSettings& n) {
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
          {"parameter_casts", n.parameter_casts}};
}

}  // namespace slipstream::aero
