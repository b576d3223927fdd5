// The `numerics:` block of the config: how the CUDA paths compute, each
// choice the same model up to rounding. Read once from the config (build_run,
// and infer from the checkpoint's config), every value checked, applied to
// the whole process, and recorded where the run's other settings are: the
// config record, the bench JSON, every checkpoint's config, and the ranks'
// config check.
//   gemm: tuned | heuristic | aten — the bf16 GEMMs on cuBLASLt, each
//     problem's algorithm timed (tuned) or cuBLASLt's first pick, or ATen's
//     GEMMs (lt_matmul.h).
//   gemm_report: print each GEMM problem's times as it is tuned.
//   slice_kernels: auto | mma — on Hopper the wgmma slice kernels (auto) or
//     the mma.sync ones other GPUs run (slice_kernels.h).
//   slice_weight_grad: gemm | kernel — the slice weights' gradient from the
//     row kernel's dlogits by a GEMM, or by the kernel that recomputes them.
//   parameter_casts: once | per_use — the bf16 copies of the parameters made
//     once a step, or at each use (parameter_casts.h).
//   fp8_amax_history, fp8_margin — under precision: fp8, the steps of amaxes
//     each scale is made from (1 to 1024) and its margin (scales 2^-margin
//     of the largest that fits, 0 to 16) (fp8_linear.h).
//   fp8_exclude — under precision: fp8, the model parts whose Linears stay
//     bf16: a list of embedding, attention_inputs (fp8::Part).
// CPU runs read and record them too; there they change nothing.
#pragma once

#include "aero/config/config.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace slipstream::aero {

struct NumericsSettings {
  std::string gemm = "tuned";
  bool gemm_report = false;
  std::string slice_kernels = "auto";
  std::string slice_weight_grad = "gemm";
  std::string parameter_casts = "once";
  int fp8_amax_history = 16;
  int fp8_margin = 0;
  std::vector<std::string> fp8_exclude;
};

// The block of `c`, each value checked (an unknown one fails naming the key
// and the choices); a config without the block (a checkpoint's, written
// before it existed) gives the defaults.
NumericsSettings numerics_settings(const Config& c);

// Makes `n` what this process's GEMMs, slice kernels and parameter casts do;
// fp8: whether the Linears' GEMMs run in fp8 (precision: fp8), with n's
// recipe.
void apply_numerics(const NumericsSettings& n, bool fp8);

// The settings as a JSON object, keyed as in the config.
nlohmann::json to_json(const NumericsSettings& n);

}  // namespace slipstream::aero
