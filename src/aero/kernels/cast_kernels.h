// Many fp32 arrays cast to bf16 (round to nearest even, as at::Tensor::to
// does) in one kernel launch: a model's parameters, recast once a step
// (parameter_casts.h) instead of one small kernel per parameter per use.
// Plain C++ interface (raw device pointers, cudaStream_t as void*), like
// the other kernel headers.
#pragma once

#include <cstdint>

namespace slipstream::aero::cast_kernels {

// Elements a chunk holds at most; a block casts one chunk.
constexpr int64_t kChunkElements = 8192;

struct Chunk {
  const float* src;
  void* dst;  // __nv_bfloat16
  int64_t n;  // 1 ..= kChunkElements
};

// Casts every chunk of `chunks` (a device array of `count`). Asynchronous
// on `stream`.
void cast_chunks(const Chunk* chunks, int64_t count, void* stream);

}  // namespace slipstream::aero::cast_kernels
