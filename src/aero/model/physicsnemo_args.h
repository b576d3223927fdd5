// Reading a PhysicsNeMo model's constructor arguments (a .mdlus's
// args.json `__args__`): typed, with errors naming the file and the key.
#pragma once

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace slipstream::aero {

// args[key] as T; `what` (the file) names the error when it is missing or
// of another type.
template <class T>
T physicsnemo_arg(const nlohmann::json& args, const char* key, const std::string& what) {
  TORCH_CHECK(args.contains(key), "'", what, "': args.json has no '", key, "'");
  try {
    return args.at(key).get<T>();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "'", what, "': args.json '", key, "' is ", args.at(key).dump(), ": ",
                e.what());
  }
}

// A width that may be null (PhysicsNeMo's "no such input"): 0 then.
int64_t physicsnemo_dim_arg(const nlohmann::json& args, const char* key, const std::string& what);

// Arguments Slipstream implements at one value only (absent: the default):
// any other value is an error naming the file, the key and what it takes.
void require_physicsnemo_args(const nlohmann::json& args,
                              const std::vector<std::pair<const char*, nlohmann::json>>& only,
                              const std::string& what);

// Whether two argument values are equal, numbers by value (4 equals 4.0).
bool same_arg_value(const nlohmann::json& a, const nlohmann::json& b);

}  // namespace slipstream::aero
