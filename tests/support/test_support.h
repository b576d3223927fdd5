// Shared test helpers: temporary directories, the fixtures folder, a
// landing probe whose steps land only when the test releases them, and the
// relative error the numerical tests compare with.
#pragma once

#include "core/readback/step_readback.h"

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace slipstream::testing {

// A fresh empty directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Removes a file or a directory tree (never std::filesystem::remove_all,
// which PyTorch 2.11's libtorch.so shadows with one that crashes).
void remove_tree(const std::string& path);

// tests/fixtures (reference outputs; see its README), or $SLIPSTREAM_FIXTURES_DIR.
std::string fixtures_dir();

// Steps land when released (or when the readback waits on them at drain).
struct HeldSteps {
  std::set<int64_t> released;
  std::vector<int64_t> waited;
  void release(int64_t step) { released.insert(step); }
  LandingProbe probe();
};

// The message of the c10::Error that `f` throws, or "" if it throws none.
std::string error_message_of(const std::function<void()>& f);

// |got - want| / |want| (Frobenius), computed in want's dtype (got is cast
// to it); |want| is floored at 1e-30.
double relative_error(const at::Tensor& got, const at::Tensor& want);

// Overrides for a `slipstream train` that must be quick: a one-layer
// Transolver on 6 train and 2 val synthetic samples of 600 points, 256 a
// step, on the CPU, its runs under `output_dir`.
std::vector<std::string> quick_train_overrides(const std::string& output_dir);

// Every line of a text file.
std::vector<std::string> read_lines(const std::string& path);

// The records of a JSONL file whose `key` is `value` (a partial or
// non-JSON line is skipped).
std::vector<nlohmann::json> jsonl_records(const std::string& path, const std::string& key,
                                          const std::string& value);

}  // namespace slipstream::testing
