// Helpers the recipe's tests share: the volume Transolver's input spec, a
// small synthetic sample, and the configs directory of the source tree.
#pragma once

#include "aero/config/config.h"
#include "aero/data/input_spec.h"
#include "aero/data/sample.h"
#include "aero/model/geotransolver/geotransolver.h"
#include "aero/model/transolver/transolver.h"
#include "core/io/safetensors.h"

#include <torch/nn/module.h>

#include <string>
#include <vector>

namespace slipstream::testing {

// embedding = [points, sdf, sdf_normals], fx = U_inf on every point.
aero::InputSpec volume_inputs();

// The Transolver options a fixture file records in its "config" metadata
// (transolver_small.safetensors).
aero::TransolverOptions fixture_transolver_options(const SafetensorsFile& f);

// The GeoTransolver a fixture file records (geotransolver_small_*.safetensors):
// its options from the "config" metadata, and the model with its "param."
// tensors loaded.
aero::GeoTransolverOptions fixture_geotransolver_options(const SafetensorsFile& f);
aero::GeoTransolver fixture_geotransolver(const SafetensorsFile& f);

// A surface's targets: pressure (scalar, nondim pressure) and wss (vector,
// nondim stress).
aero::FieldSchema surface_field_schema();

// Synthetic sample `index` with `points` points (seed 1234).
aero::Sample synthetic_sample(int64_t index, int64_t points);

// configs/ of the source tree, loaded with `overrides`.
aero::Config load_config(const std::vector<std::string>& overrides);

// Compares a model's parameters with a fixture's list ("name [d0, d1]" per
// line, in PhysicsNeMo's order, then "total N"): line by line, names,
// shapes, order and the total. Adds a gtest failure per difference.
void expect_parameters_as_listed(const torch::nn::Module& model, const std::string& fixture);

}  // namespace slipstream::testing
