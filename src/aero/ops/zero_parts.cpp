#include "aero/ops/zero_parts.h"

#include <ATen/ATen.h>

namespace slipstream::aero {

std::vector<at::Tensor> zero_parts(const at::Tensor& like,
                                   const std::vector<std::vector<int64_t>>& shapes) {
  constexpr int64_t kAlign = 64;  // floats: 256 bytes
  std::vector<int64_t> offsets, counts;
  int64_t total = 0;
  for (const auto& shape : shapes) {
    int64_t n = 1;
    for (const int64_t s : shape) {
      TORCH_CHECK(s >= 0, "zero_parts: negative size in ", at::IntArrayRef(shape));
      n *= s;
    }
    offsets.push_back(total);
    counts.push_back(n);
    total += (n + kAlign - 1) / kAlign * kAlign;
  }
  const auto buffer = at::zeros({total}, like.options().dtype(at::kFloat));
  std::vector<at::Tensor> parts;
  parts.reserve(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    parts.push_back(buffer.narrow(0, offsets[i], counts[i]).view(shapes[i]));
  }
  return parts;
}

}  // namespace slipstream::aero
