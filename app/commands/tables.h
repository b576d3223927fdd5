// Text tables the commands print.
#pragma once

#include "aero/forces/force_coefficients.h"
#include "core/device/kernel_profile.h"

#include <map>
#include <string>
#include <vector>

namespace slipstream::app {

// The `top` longest kernels per step: ms, calls and share of the total.
std::string format_kernel_table(const std::vector<KernelTime>& times, int steps, int top);

// The force coefficients over a split, in coefficient_names() order: pred
// mean, true mean, MAE and R² per coefficient.
std::string format_forces_table(
    const std::map<std::string, aero::CoefficientSummary>& coefficients);

}  // namespace slipstream::app
