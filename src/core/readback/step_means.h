// StepMeans: the epoch summary's per-key means of the delivered step values.
// A non-finite step value is left out of its key's mean (and counted in
// nonfinite()); a key no step gave a finite value is NaN.
#pragma once

#include "core/readback/step_readback.h"

#include <nlohmann/json.hpp>

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
  // The running sums, exactly (a checkpoint taken mid-epoch carries them so
  // that the resumed epoch's summary covers all of its steps).
  nlohmann::json state() const;
  static StepMeans from_state(const nlohmann::json& state);

 private:
  struct Sum {
    double total = 0.0;
    int64_t finite = 0, nonfinite = 0;
  };
  std::map<std::string, Sum> sums_;
};

}  // namespace slipstream
