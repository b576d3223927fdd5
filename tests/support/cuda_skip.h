// SKIP_WITHOUT_CUDA(): the first line of a *_CUDA test, which then skips
// itself where no CUDA device is present (CI's CPU machines).
#pragma once

#include "core/device/device.h"

#include <gtest/gtest.h>

#define SKIP_WITHOUT_CUDA() \
  if (!::slipstream::cuda_available()) GTEST_SKIP() << "no CUDA device"
