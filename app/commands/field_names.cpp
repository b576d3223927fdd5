#include "commands/field_names.h"

#include <c10/util/Exception.h>

namespace slipstream::app {

void FieldNameOptions::add_to(CLI::App* sub) {
  sub->add_option("--field", pairs,
                  "TARGET=VTU_FIELD: where a target field is in the .vtu (default: DrivAerML's "
                  "name, else the target's own)");
  for (const char* target : {"velocity", "pressure", "nut"}) {
    sub->add_option(std::string("--") + target + "-field", shorthands[target],
                    std::string("the .vtu field of ") + target);
  }
}

std::map<std::string, std::string> FieldNameOptions::resolve() const {
  std::map<std::string, std::string> out;
  for (const auto& p : pairs) {
    const auto eq = p.find('=');
    TORCH_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < p.size(), "--field '", p,
                "' is not of the form TARGET=VTU_FIELD");
    out[p.substr(0, eq)] = p.substr(eq + 1);
  }
  for (const auto& [target, name] : shorthands) {
    if (!name.empty()) out[target] = name;
  }
  return out;
}

}  // namespace slipstream::app
