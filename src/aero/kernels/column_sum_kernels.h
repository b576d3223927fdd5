// The sum over rows of a (rows, width) bf16 matrix in fp32: the bias
// gradient of a Linear layer. Two passes, so that the result does not
// depend on timing: each block sums a run of rows into its own row of
// `partial`, then one pass adds those rows in block order. Plain C++
// interface (raw device pointers, cudaStream_t as void*), like
// slice_kernels.h; linear.cpp wraps it for tensors.
#pragma once

#include <cstdint>

namespace slipstream::aero::column_sum_kernels {

// Widths the kernels take: multiples of 8 up to 2048 (m 16-byte aligned).
bool supported(int64_t width);

// Rows of `partial` that column_sum writes for these rows (at least 1).
int64_t partial_rows(int64_t rows, int64_t width);

// out[c] = sum_r m[r, c]; partial: (partial_rows(rows, width), width) fp32
// scratch. Asynchronous on `stream`.
void column_sum(const void* m, int64_t rows, int64_t width, float* partial, float* out,
                void* stream);

// out[c] = the sum of column c over the `blocks` rows of partial (blocks,
// width) fp32, in row order: column_sum's second pass, for a kernel that
// makes the partial rows itself (gelu_kernels). Asynchronous on `stream`.
void finish(const float* partial, int64_t blocks, int64_t width, float* out, void* stream);

}  // namespace slipstream::aero::column_sum_kernels
