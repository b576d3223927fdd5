// CRC-32C (Castagnoli), as TFRecord framing uses it, and TensorFlow's mask.
#pragma once

#include <cstddef>
#include <cstdint>

namespace slipstream {

uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
// TFRecord's masked CRC: rotate right by 15 bits and add 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);

}  // namespace slipstream
