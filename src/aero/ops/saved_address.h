// An object's address passed through an autograd function, whose arguments
// and saved_data hold integers and tensors, not pointers: the caller passes
// address_of(&obj), the function takes it back with object_at<T>(a).
#pragma once

#include <cstdint>

namespace slipstream::aero {

template <typename T>
int64_t address_of(T* p) {
  return reinterpret_cast<int64_t>(p);
}

template <typename T>
T* object_at(int64_t address) {
  // NOLINTNEXTLINE(performance-no-int-to-ptr): the address address_of made
  return reinterpret_cast<T*>(address);
}

}  // namespace slipstream::aero
