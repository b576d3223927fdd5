// ExitError: an error that ends the process with its own exit code, so that
// a caller (a scheduler, a launcher, a script) can tell it from a plain
// failure (exit 1). The command-line front end exits with code() after
// printing what().
#pragma once

#include <stdexcept>
#include <string>

namespace slipstream {

class ExitError : public std::runtime_error {
 public:
  ExitError(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// The exit codes besides 0 (success) and 1 (an error).
constexpr int kExitNonFinite = 3;  // a non-finite loss or gradient stopped training

}  // namespace slipstream
