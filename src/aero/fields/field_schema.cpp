#include "aero/fields/field_schema.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <set>

namespace slipstream::aero {

FieldType parse_field_type(const std::string& name) {
  if (name == "scalar") return FieldType::kScalar;
  if (name == "vector") return FieldType::kVector;
  TORCH_CHECK(false, "fields: type '", name, "' is not one of scalar, vector");
}

Nondim parse_nondim(const std::string& name) {
  if (name == "identity") return Nondim::kIdentity;
  if (name == "velocity") return Nondim::kVelocity;
  if (name == "pressure") return Nondim::kPressure;
  if (name == "stress") return Nondim::kStress;
  TORCH_CHECK(false, "fields: non-dimensionalisation '", name,
              "' is not one of identity, velocity, pressure, stress");
}

std::string to_string(FieldType type) { return type == FieldType::kVector ? "vector" : "scalar"; }

std::string to_string(Nondim nondim) {
  switch (nondim) {
    case Nondim::kVelocity:
      return "velocity";
    case Nondim::kPressure:
      return "pressure";
    case Nondim::kStress:
      return "stress";
    case Nondim::kIdentity:
      break;
  }
  return "identity";
}

FieldSchema::FieldSchema(std::vector<FieldSpec> fields) : fields_(std::move(fields)) {
  std::set<std::string> seen;
  for (auto& f : fields_) {
    TORCH_CHECK(!f.name.empty(), "fields: a target field has an empty name");
    TORCH_CHECK(seen.insert(f.name).second, "fields: target '", f.name, "' is declared twice");
    TORCH_CHECK(std::isfinite(f.std_dev) && f.std_dev > 0, "fields: target '", f.name, "' has std ",
                f.std_dev, "; it must be finite and > 0");
    TORCH_CHECK(std::isfinite(f.loss_weight) && f.loss_weight >= 0, "fields: target '", f.name,
                "' has loss weight ", f.loss_weight, "; it must be finite and >= 0");
    if (f.mean.empty()) f.mean.assign(static_cast<size_t>(f.channels()), 0.0);
    if (f.mean.size() == 1 && f.channels() == 3) f.mean.assign(3, f.mean[0]);
    TORCH_CHECK(static_cast<int64_t>(f.mean.size()) == f.channels(), "fields: target '", f.name,
                "' is a ", to_string(f.type), " but its mean has ", f.mean.size(), " values");
    for (double m : f.mean) {
      TORCH_CHECK(std::isfinite(m), "fields: target '", f.name, "' has a non-finite mean");
    }
    offsets_.push_back(total_channels_);
    total_channels_ += f.channels();
  }
}

const FieldSpec* FieldSchema::find(const std::string& name) const {
  for (const auto& f : fields_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::vector<std::string> FieldSchema::names() const {
  std::vector<std::string> out;
  for (const auto& f : fields_) out.push_back(f.name);
  return out;
}

namespace {

// The non-dimensional value is (physical - offset) / scale.
double nondim_scale(Nondim nondim, const FreeStream& fs) {
  switch (nondim) {
    case Nondim::kVelocity:
      return fs.speed;
    case Nondim::kPressure:
    case Nondim::kStress:
      return fs.dynamic_pressure();
    case Nondim::kIdentity:
      break;
  }
  return 1.0;
}

double nondim_offset(Nondim nondim, const FreeStream& fs) {
  return nondim == Nondim::kPressure ? fs.p : 0.0;
}

bool all_zero(const std::vector<double>& v) {
  for (double x : v) {
    if (x != 0.0) return false;
  }
  return true;
}

}  // namespace

torch::Tensor FieldSchema::to_model(const FieldSpec& field, const torch::Tensor& physical,
                                    const FreeStream& free_stream) const {
  TORCH_CHECK(physical.dim() == 2 && physical.size(1) == field.channels(), "fields: target '",
              field.name, "' has shape ", physical.sizes(), ", expected (N, ", field.channels(),
              ")");
  auto y = physical;
  if (field.nondim != Nondim::kIdentity) {
    y = (y - nondim_offset(field.nondim, free_stream)) / nondim_scale(field.nondim, free_stream);
  }
  if (!all_zero(field.mean)) {
    y = y - torch::tensor(field.mean, torch::kDouble).to(y.scalar_type()).view({1, -1});
  }
  if (field.std_dev != 1.0) y = y / field.std_dev;
  return y;
}

torch::Tensor FieldSchema::to_physical(const FieldSpec& field, const torch::Tensor& model_space,
                                       const FreeStream& free_stream) const {
  auto y = model_space;
  if (field.std_dev != 1.0) y = y * field.std_dev;
  if (!all_zero(field.mean)) {
    y = y + torch::tensor(field.mean, torch::kDouble).to(y.scalar_type()).view({1, -1});
  }
  if (field.nondim != Nondim::kIdentity) {
    y = y * nondim_scale(field.nondim, free_stream) + nondim_offset(field.nondim, free_stream);
  }
  return y;
}

nlohmann::json FieldSchema::to_json() const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& f : fields_) {
    out.push_back({{"name", f.name},
                   {"type", to_string(f.type)},
                   {"nondim", to_string(f.nondim)},
                   {"mean", f.mean},
                   {"std", f.std_dev},
                   {"loss_weight", f.loss_weight}});
  }
  return out;
}

FieldSchema FieldSchema::from_json(const nlohmann::json& j) {
  TORCH_CHECK(j.is_array(), "fields: expected a JSON list of fields, got ", j.dump());
  std::vector<FieldSpec> fields;
  for (const auto& e : j) {
    FieldSpec f;
    try {
      f.name = e.at("name").get<std::string>();
      f.type = parse_field_type(e.at("type").get<std::string>());
      f.nondim = parse_nondim(e.value("nondim", std::string("identity")));
      f.mean = e.value("mean", std::vector<double>{});
      f.std_dev = e.value("std", 1.0);
      f.loss_weight = e.value("loss_weight", 1.0);
    } catch (const nlohmann::json::exception& ex) {
      TORCH_CHECK(false, "fields: malformed field entry ", e.dump(), ": ", ex.what());
    }
    fields.push_back(std::move(f));
  }
  return FieldSchema(std::move(fields));
}

bool FieldSchema::operator==(const FieldSchema& o) const { return to_json() == o.to_json(); }

FieldSchema default_volume_fields() {
  return FieldSchema({{"velocity", FieldType::kVector, Nondim::kIdentity, {}, 1.0, 1.0},
                      {"pressure", FieldType::kScalar, Nondim::kIdentity, {}, 1.0, 1.0},
                      {"nut", FieldType::kScalar, Nondim::kIdentity, {}, 1.0, 1.0}});
}

}  // namespace slipstream::aero
