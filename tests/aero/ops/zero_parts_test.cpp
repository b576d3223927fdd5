#include "aero/ops/zero_parts.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace slipstream::aero {
namespace {

TEST(ZeroParts, GivesZeroedDisjointTensorsOfTheShapesAsked256BytesApart) {
  const auto like = torch::ones({3}, torch::kBFloat16);
  const std::vector<std::vector<int64_t>> shapes{{2, 3, 5}, {7}, {1, 64}, {0}, {65}};
  auto parts = zero_parts(like, shapes);
  ASSERT_EQ(parts.size(), shapes.size());
  std::vector<std::pair<const float*, const float*>> ranges;
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto& p = parts[i];
    EXPECT_EQ(p.sizes(), at::IntArrayRef(shapes[i]));
    EXPECT_EQ(p.scalar_type(), torch::kFloat);
    EXPECT_TRUE(p.is_contiguous());
    if (p.numel() == 0) continue;  // an empty part has no place to check
    const auto offset =
        static_cast<const char*>(p.data_ptr()) - static_cast<const char*>(parts.front().data_ptr());
    EXPECT_EQ(offset % 256, 0) << "part " << i;
    EXPECT_EQ(p.count_nonzero().item<int64_t>(), 0) << "part " << i;
    const auto* begin = p.data_ptr<float>();
    ranges.emplace_back(begin, begin + p.numel());
  }
  // Writing every element of each part leaves the others zero.
  for (size_t i = 0; i < parts.size(); ++i) {
    parts[i].fill_(static_cast<float>(i + 1));
    for (size_t j = 0; j < parts.size(); ++j) {
      const float want = j <= i ? static_cast<float>(j + 1) : 0.0F;
      if (parts[j].numel() > 0) {
        EXPECT_TRUE(parts[j].eq(want).all().item<bool>()) << "after " << i << ", part " << j;
      }
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].second, ranges[i].first);
}

TEST(ZeroParts, RefusesANegativeSize) {
  EXPECT_THROW(zero_parts(torch::zeros({1}), {{2, -1}}), c10::Error);
}

}  // namespace
}  // namespace slipstream::aero
