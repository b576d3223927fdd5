// StepMeans: the epoch summary's per-key means of the delivered step values.
// A non-finite step value is left out of its key's mean (and counted in
// nonfinite()); a key no step gave a finite value is NaN.
#pragma once

#include "core/readback/step_readback.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace slipstream {

class StepMeans {
 public:
  void add(const NamedValues& values);
  std::map<std::string, double> means() const;
  // Steps whose value of `key` was NaN or Inf.
  int64_t nonfinite(const std::string& key) const;

 private:
  struct Sum {
    double total = 0.0;
    int64_t finite = 0, nonfinite = 0;
  };
  std::map<std::string, Sum> sums_;
};

}  // namespace slipstream
