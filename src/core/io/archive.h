// Archives of named byte blobs, as PyTorch and PhysicsNeMo write them:
//   - zip, entries stored (not compressed): torch.save's format and
//     PhysicsNeMo's .mdlus since 0.1.0. read_archive checks each entry's
//     CRC-32; write_zip writes stored entries, each one's data aligned to
//     `alignment` bytes from the start of the file (torch.save aligns its
//     storages to 64 so that a reader can map them).
//   - tar (ustar or GNU): the .mdlus of older PhysicsNeMo versions.
// Every malformed, truncated or compressed archive throws c10::Error naming
// `what` (the file) and the entry; so do zip entries that share bytes or a
// name, which bounds what is read out to the file's size. No zip64: an
// archive over 4 GiB is an error.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace slipstream {

// Entries by name. `what` names the archive in errors.
std::map<std::string, std::string> read_archive(const std::string& bytes, const std::string& what);

// The zip file's bytes, entries in the given order.
std::string write_zip(const std::vector<std::pair<std::string, std::string>>& entries,
                      int64_t alignment = 64);

// CRC-32 (IEEE 802.3, zlib's), as zip records it.
uint32_t crc32_ieee(const void* data, size_t size);

}  // namespace slipstream
