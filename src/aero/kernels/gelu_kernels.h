// GELU's backward and its recompute in one pass, for linear.h's gelu_linear
// on CUDA: from h and g = dL/dgelu(h) (bf16), it writes dL/dh over g and
// gelu(h) into a, reading h once. Exact (erf) GELU in fp32 arithmetic, the
// formulas ATen's kernels use, bitwise ATen's results for every finite
// bf16 (most inputs read from per-block tables of those formulas' values).
// Plain C++ interface (raw device pointers, cudaStream_t as void*), like
// slice_kernels.h.
#pragma once

#include <cstdint>

namespace slipstream::aero::gelu_kernels {

// Whether the kernel takes these: n a multiple of 8, every pointer 16-byte
// aligned.
bool supported(const void* h, const void* g, const void* a, int64_t n);

// g[i] <- g[i] * gelu'(h[i]), a[i] <- gelu(h[i]) for i < n. Asynchronous on
// `stream`.
void backward_and_forward(const void* h, void* g, void* a, int64_t n, void* stream);

// Whether backward_and_forward_sums takes a (rows, width) matrix: width a
// multiple of 8 up to 2048, every pointer 16-byte aligned.
bool sums_supported(const void* h, const void* g, const void* a, int64_t width);

// Rows of `partial` that backward_and_forward_sums needs (at least 1).
int64_t sums_partial_rows(int64_t rows, int64_t width);

// backward_and_forward on (rows, width) row-major h, g and a (a null: gelu(h)
// not written, for a caller that kept it), and colsum[c]
// = sum_r g[r, c] of the new g as stored (bf16), in fp32 and a fixed order
// (the bias gradient of the Linear before the GELU, without reading g
// again); partial: (sums_partial_rows(rows, width), width) fp32 scratch.
void backward_and_forward_sums(const void* h, void* g, void* a, int64_t rows, int64_t width,
                               float* partial, float* colsum, void* stream);

// a[i] <- gelu(h[i]) for i < n (the forward; supported(h, a, a, n)).
void forward(const void* h, void* a, int64_t n, void* stream);

}  // namespace slipstream::aero::gelu_kernels
