// Text tables the commands print.
#pragma once

#include "core/device/kernel_profile.h"

#include <string>
#include <vector>

namespace slipstream::app {

// The `top` longest kernels per step: ms, calls and share of the total.
std::string format_kernel_table(const std::vector<KernelTime>& times, int steps, int top);

}  // namespace slipstream::app
