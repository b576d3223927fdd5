#include "core/io/crc32c.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace slipstream {
namespace {

TEST(Crc32cTest, GoldenValues) {
  const std::string digits = "123456789";
  EXPECT_EQ(crc32c(digits.data(), digits.size()), 0xE3069283u);
  const std::vector<unsigned char> zeros(32, 0);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  const std::vector<unsigned char> ones(32, 0xFF);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

TEST(Crc32cTest, IncrementalEqualsOneShot) {
  const std::string text = "brain.Event:2 and some more bytes";
  const uint32_t head = crc32c(text.data(), 10);
  EXPECT_EQ(crc32c(text.data() + 10, text.size() - 10, head), crc32c(text.data(), text.size()));
}

TEST(Crc32cTest, MaskRotatesAndAddsTheConstant) {
  const std::string digits = "123456789";
  const uint32_t crc = 0xE3069283u;
  EXPECT_EQ(masked_crc32c(digits.data(), digits.size()),
            static_cast<uint32_t>(((crc >> 15) | (crc << 17)) + 0xa282ead8u));
}

}  // namespace
}  // namespace slipstream
