// fp8 casts with per-tensor scales and the delayed-scaling update of those
// scales, for precision: fp8 (ops/fp8_linear.h). Plain C++ interface (raw
// device pointers, cudaStream_t as void*), like the other kernel headers.
//
// A tensor x is stored in fp8 as q = saturate(x * scale), so q / scale is x
// rounded: the GEMM is handed 1 / scale. Delayed scaling (as Transformer
// Engine does it): each cast records max |x| (its amax) in `amax`, and the
// scales used are made from the amaxes of the last `history` steps, so no
// cast waits for a reduction over its own input.
#pragma once

#include <cstdint>

namespace slipstream::aero::fp8_kernels {

enum class Format { kE4M3, kE5M2 };  // OCP formats: e4m3 (fn: no infinities), e5m2

// The largest finite value: 448 (e4m3), 57344 (e5m2).
float max_finite(Format f);

// out (rows_out, cols) = saturate(in * scale[0]) in `format`, in (rows,
// cols) row-major bf16 (in_fp32 false) or fp32, its rows past `rows` zero
// (rows_out >= rows: padding for the fp8 GEMMs, which need multiples of
// 16); out_t (cols, rows_out), unless null, the same values transposed;
// out null: neither is written (the amax alone, for a first scale). amax[0] becomes max(amax[0],
// max |in|): +inf when in holds a non-finite value. Values beyond the format's range saturate to
// its largest finite value; NaN stays NaN. Asynchronous on `stream`.
void quantize(const void* in, bool in_fp32, int64_t rows, int64_t rows_out, int64_t cols,
              const float* scale, Format format, uint8_t* out, uint8_t* out_t, float* amax,
              void* stream);

// quantize() of gelu(h) (g null) or of GELU's backward g * gelu'(h) (g
// not null), h and g (rows, cols) bf16, each value formed in fp32 and
// rounded to bf16 as ATen's gelu and gelu_backward round theirs
// (kernels/common/gelu.cuh), so that out, out_t and amax are quantize()'s
// of those ops' outputs, byte for byte, without writing them. With g and
// colsum not null: colsum[c] = the sum over rows of column c of those bf16
// values, in fp32 and a fixed order, through `partial`
// (gelu_partial_rows(rows_out, cols, format), cols) fp32 scratch: the bias
// gradient of the Linear before the GELU. With g and out not null, `also`
// (unless null) has the same pass over h cast gelu(h) itself as well, as
// the call with g null casts it, in e4m3 at also->scale, into also->out_t
// (cols, rows_out) alone, its amax into also->amax: the copy for the
// second product's weight gradient that a forward did not keep, without
// reading h again. Takes what gelu_supported says; throws otherwise.
// Asynchronous on `stream`.
struct GeluForwardCopy {
  const float* scale;
  uint8_t* out_t;
  float* amax;
};
bool gelu_supported(int64_t rows_out, int64_t cols, const void* h, const void* g,
                    const uint8_t* out, const uint8_t* out_t,
                    const GeluForwardCopy* also = nullptr);
int64_t gelu_partial_rows(int64_t rows_out, int64_t cols, Format format);
void quantize_gelu(const void* h, const void* g, int64_t rows, int64_t rows_out, int64_t cols,
                   const float* scale, Format format, uint8_t* out, uint8_t* out_t, float* amax,
                   float* partial, float* colsum, void* stream,
                   const GeluForwardCopy* also = nullptr);

// The scales of `count` tensors (slots) after a step, in one launch: for each slot s, amax[s] is
// recorded in history[s][*cursor % history_len] (a non-finite one as 0, so that an overflowing step
// leaves the scales as they were) and amax[s] is reset to 0; then m = the largest value of
// history[s]; where m > 0, scale[s] = limit[s] / m / 2^margin and scale_inv[s * inv_stride] =
// 1 / scale[s] (else both unchanged). *cursor is then advanced by one. All on the device: nothing
// waits for the host. (cuBLASLt reads the inverse scales by pointer, 16-byte aligned: stride 4.)
void update_scales(float* amax, float* history, float* scale, float* scale_inv, int64_t inv_stride,
                   const float* limit, int64_t count, int history_len, int margin, int64_t* cursor,
                   void* stream);

// A slot's first scale, from the amax of its first cast (made with
// quantize into amax[0] before the real cast): scale[0] = limit / amax[0] /
// 2^margin and scale_inv[0] = 1 / scale[0], where amax[0] is > 0 and finite
// (else 1 and 1). amax[0] is left as it is. Asynchronous on `stream`.
void scale_from_amax(const float* amax, float limit, int margin, float* scale, float* scale_inv,
                     void* stream);

}  // namespace slipstream::aero::fp8_kernels
