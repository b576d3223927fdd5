// Inference at full resolution: a trained model over every point (volume)
// or every cell (surface) of a sample, the prediction's errors against the
// truth and, for a surface, the force coefficients (forces/) from the
// predicted and from the true fields, plus the CFD's own where the sample
// carries them (CD_cfd, CL_cfd, CS_cfd). Then the same over a split:
// per-field means and, per coefficient, pred mean, true mean, MAE and R².
//
// A surface goes through the model in one no-grad pass where it fits; on
// an out-of-memory error the pass is split in halves until it fits (and the
// result says how many chunks it took). A volume goes in chunks of the
// training resolution. For Transolver, chunks are exact (TrainedModel::
// predict): the slice sums span every point whatever the chunk size.
#pragma once

#include "aero/data/sample_envelope.h"
#include "aero/forces/force_coefficients.h"
#include "aero/forces/force_loss.h"
#include "aero/infer/trained_model.h"

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace slipstream::aero {

// CD ... CMY of `sample` (a surface: points, normals, area) with the fields
// given in physical units as (N, C) in the schema's channel order. Throws
// naming the sample when it is not a surface sample.
std::map<std::string, double> surface_forces(const Sample& sample, const torch::Tensor& physical,
                                             const FieldSchema& fields,
                                             const ForceSettings& settings);

struct SampleInference {
  std::string id;
  int64_t points = 0;
  int64_t chunks = 0;                     // model passes it took
  double seconds = 0;                     // model time (including the host copies)
  double peak_memory_gib = 0;             // the device's peak during the model passes
  torch::Tensor prediction;               // (N, C) physical units
  std::map<std::string, double> metrics;  // <field>_l2 (relative L2), <field>_mae
  // Empty for a volume sample (or forces disabled / not derivable).
  std::map<std::string, double> forces_pred, forces_true, forces_cfd;
  // Held against the training envelope (false: the model records none).
  bool envelope_known = false;
  std::vector<OutOfRange> out_of_range;  // empty: within what it was trained on
};

SampleInference infer_sample(const TrainedModel& trained, const Sample& sample);

// The per-sample record (phase infer_step: in_distribution true/false, or
// null without an envelope, and out_of_distribution [{name, value, min,
// max}]) and the split's records
// (infer_summary, and infer_forces_summary when any sample had forces).
nlohmann::json infer_step_record(const SampleInference& result, size_t index);
struct SplitSummary {
  nlohmann::json summary;  // infer_summary
  nlohmann::json forces;   // infer_forces_summary, null if none
  std::map<std::string, CoefficientSummary> coefficients;
};
SplitSummary summarize_split(const std::vector<SampleInference>& results, const std::string& split);

}  // namespace slipstream::aero
