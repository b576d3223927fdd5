// StepScalars: the named on-device 0-d tensors one step hands to the readback.
//
// A step adds its total loss, per-field losses and metrics as 0-d tensors on
// the device that produced them. A metric computed over masked targets also
// carries its count of finite targets, so that the readback can weight each
// rank's value by it. Adding never reads a tensor's value: no host sync.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace slipstream {

class StepScalars {
 public:
  struct Entry {
    std::string key;
    at::Tensor value;         // 0-d, any floating dtype
    at::Tensor finite_count;  // 0-d or undefined (unmasked: count 1)
  };

  // An unmasked value: every rank contributes with weight 1.
  void add(std::string key, at::Tensor value);
  // A masked value with the count of finite targets that went into it.
  // A rank whose count is 0 contributes nothing; if every rank's count is 0
  // the delivered value is NaN.
  void add_counted(std::string key, at::Tensor value, at::Tensor finite_count);

  const std::vector<Entry>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  bool has_counts() const { return has_counts_; }
  void clear() {
    entries_.clear();
    has_counts_ = false;
  }

 private:
  std::vector<Entry> entries_;
  bool has_counts_ = false;
};

}  // namespace slipstream
