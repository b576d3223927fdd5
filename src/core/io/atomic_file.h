// write_file_atomically: a file appears whole under its name or not at all.
// The bytes go to "<path>.tmp.<pid>", are flushed and fsync'ed, then renamed over
// `path`; on any failure the temp file is removed and a c10::Error names the
// file and the system's reason (ENOSPC: "No space left on device").
#pragma once

#include <string>

namespace slipstream {

void write_file_atomically(const std::string& path, const std::string& bytes);

}  // namespace slipstream
