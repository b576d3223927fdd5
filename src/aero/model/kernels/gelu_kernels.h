// GELU's backward and its recompute in one pass, for linear.h's gelu_linear
// on CUDA: from h and g = dL/dgelu(h) (bf16), it writes dL/dh over g and
// gelu(h) into a, reading h once. Exact (erf) GELU in fp32 arithmetic, the
// formulas ATen's kernels use. Plain C++ interface (raw device pointers,
// cudaStream_t as void*), like slice_kernels.h.
#pragma once

#include <cstdint>

namespace slipstream::aero::gelu_kernels {

// Whether the kernel takes these: n a multiple of 8, every pointer 16-byte
// aligned.
bool supported(const void* h, const void* g, const void* a, int64_t n);

// g[i] <- g[i] * gelu'(h[i]), a[i] <- gelu(h[i]) for i < n. Asynchronous on
// `stream`.
void backward_and_forward(const void* h, void* g, void* a, int64_t n, void* stream);

// a[i] <- gelu(h[i]) for i < n (the forward; supported(h, a, a, n)).
void forward(const void* h, void* a, int64_t n, void* stream);

}  // namespace slipstream::aero::gelu_kernels
