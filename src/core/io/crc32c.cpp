#include "core/io/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace slipstream {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // reflected Castagnoli

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kPolynomial : c >> 1;
    table[i] = c;
  }
  return table;
}

// `crc` is the running (inverted) value in both.
uint32_t crc32c_table(const unsigned char* p, size_t size, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_table();
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
// SSE4.2's crc32 instruction computes the same polynomial, 8 bytes a step:
// checkpoints of hundreds of MB are checksummed at memory speed.
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const unsigned char* p, size_t size,
                                                        uint32_t crc) {
  uint64_t c = crc;
  for (; size >= 8; size -= 8, p += 8) {
    uint64_t word = 0;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  auto c32 = static_cast<uint32_t>(c);
  for (; size > 0; --size, ++p) c32 = _mm_crc32_u8(c32, *p);
  return c32;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  if (hardware) return ~crc32c_sse42(p, size, ~crc);
#endif
  return ~crc32c_table(p, size, ~crc);
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace slipstream
