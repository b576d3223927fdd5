// FieldSchema: the one table of the target fields a model predicts, in
// channel order, as a dataset declares them (the recipe's `targets:` block,
// e.g. {velocity: vector, pressure: scalar, nut: scalar}).
//
// Per field: its name, whether it is a scalar (1 channel) or a vector (3
// channels, components x, y, z), how it is made non-dimensional from the
// sample's free stream, its z-score normalisation, and its loss weight.
// The loader takes a field from physical units to the model's space with
// to_model() (non-dimensionalise, then normalise); inference goes back with
// to_physical(). A vector field shares one std across its components (so a
// rotation commutes with the normalisation when its mean is zero).
//
// Non-dimensionalisation, with q = rho_inf |U_inf|^2 / 2:
//   velocity  u / |U_inf|
//   pressure  (p - p_inf) / q      (the pressure coefficient Cp)
//   stress    tau / q              (the skin-friction coefficient Cf)
//   identity  unchanged
// The schema round-trips through JSON so that a checkpoint carries the
// statistics it was trained with.
#pragma once

#include <torch/types.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace slipstream::aero {

enum class FieldType { kScalar, kVector };
enum class Nondim { kIdentity, kVelocity, kPressure, kStress };

FieldType parse_field_type(const std::string& name);  // "scalar" | "vector"
Nondim parse_nondim(const std::string& name);  // "identity" | "velocity" | "pressure" | "stress"
std::string to_string(FieldType type);
std::string to_string(Nondim nondim);

// The reference values non-dimensionalisation uses, from one sample.
struct FreeStream {
  double speed = 1.0;  // |U_inf|
  double rho = 1.0;    // rho_inf
  double p = 0.0;      // p_inf
  double dynamic_pressure() const { return 0.5 * rho * speed * speed; }
};

struct FieldSpec {
  std::string name;
  FieldType type = FieldType::kScalar;
  Nondim nondim = Nondim::kIdentity;
  std::vector<double> mean;  // one per channel; empty means zeros
  double std_dev = 1.0;      // shared by a vector's components
  double loss_weight = 1.0;

  int64_t channels() const { return type == FieldType::kVector ? 3 : 1; }
};

class FieldSchema {
 public:
  FieldSchema() = default;
  // Checks names (non-empty, unique), std > 0, finite means of the right
  // length; throws c10::Error naming the field.
  explicit FieldSchema(std::vector<FieldSpec> fields);

  const std::vector<FieldSpec>& fields() const { return fields_; }
  size_t size() const { return fields_.size(); }
  bool empty() const { return fields_.empty(); }
  int64_t total_channels() const { return total_channels_; }
  // The first channel of field i in the model's output.
  int64_t offset(size_t i) const { return offsets_.at(i); }
  // The field named `name`, or null.
  const FieldSpec* find(const std::string& name) const;
  std::vector<std::string> names() const;

  // One field, (N, channels), physical units -> the model's space and back.
  torch::Tensor to_model(const FieldSpec& field, const torch::Tensor& physical,
                         const FreeStream& free_stream) const;
  torch::Tensor to_physical(const FieldSpec& field, const torch::Tensor& model_space,
                            const FreeStream& free_stream) const;

  nlohmann::json to_json() const;
  static FieldSchema from_json(const nlohmann::json& j);
  bool operator==(const FieldSchema& other) const;

 private:
  std::vector<FieldSpec> fields_;
  std::vector<int64_t> offsets_;
  int64_t total_channels_ = 0;
};

// The recipe's volume targets: velocity (vector), pressure (scalar), nut
// (scalar), every one identity-scaled and unnormalised.
FieldSchema default_volume_fields();

}  // namespace slipstream::aero
