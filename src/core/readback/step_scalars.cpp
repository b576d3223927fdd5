#include "core/readback/step_scalars.h"

#include <utility>

namespace slipstream {

void StepScalars::add(std::string key, at::Tensor value) {
  entries_.push_back(Entry{std::move(key), std::move(value), at::Tensor()});
}

void StepScalars::add_counted(std::string key, at::Tensor value, at::Tensor finite_count) {
  entries_.push_back(Entry{std::move(key), std::move(value), std::move(finite_count)});
  has_counts_ = true;
}

}  // namespace slipstream
