#include "aero/model/physicsnemo_args.h"

namespace slipstream::aero {

int64_t physicsnemo_dim_arg(const nlohmann::json& args, const char* key, const std::string& what) {
  return args.contains(key) && args.at(key).is_null() ? 0
                                                      : physicsnemo_arg<int64_t>(args, key, what);
}

bool same_arg_value(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  if (a.is_array() && b.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!same_arg_value(a[i], b[i])) return false;
    }
    return true;
  }
  return a == b;
}

void require_physicsnemo_args(const nlohmann::json& args,
                              const std::vector<std::pair<const char*, nlohmann::json>>& only,
                              const std::string& what) {
  for (const auto& [key, want] : only) {
    if (!args.contains(key) || same_arg_value(args.at(key), want)) continue;
    TORCH_CHECK(false, "'", what, "': args.json '", key, "' is ", args.at(key).dump(),
                "; Slipstream implements only ", want.dump());
  }
}

}  // namespace slipstream::aero
