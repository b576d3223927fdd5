// The range a set of samples spans, so that a model trained on them can say
// when it is asked about something else (DESIGN §15). A training run
// records the envelope of its train split in every checkpoint; `infer`
// holds each sample against it and marks what lies outside.
//
// A sample is described by (physical units, before any transform):
//   extent_x, extent_y, extent_z  the span of its points between their 1st
//                                 and 99th percentiles per axis (a volume
//                                 sample's fluid points, a surface's cells),
//                                 on at most 65,536 of them: robust to a far
//                                 field that a few thousand rows miss
//   U_inf_speed, U_inf_yaw_deg (atan2(uy, ux)), U_inf_pitch_deg
//   every other scalar global: L_ref, A_ref, rho_inf, p_inf and a dataset's
//   own parameters (an Ahmed body's slant angle `phi`, ...), except the
//   CFD's own coefficients (*_cfd), which are results, not inputs.
#pragma once

#include "aero/data/dataset.h"
#include "aero/data/sample.h"

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace slipstream::aero {

std::map<std::string, double> describe_sample(const Sample& sample);

struct OutOfRange {
  std::string name;
  double value = 0, min = 0, max = 0;
};

class SampleEnvelope {
 public:
  void add(const Sample& sample);
  bool empty() const { return samples_ == 0; }
  int64_t samples() const { return samples_; }
  const std::map<std::string, std::pair<double, double>>& ranges() const { return ranges_; }

  // Each description of `sample` outside its [min, max], widened on both
  // sides by `margin` times the range's width and by a share of its
  // magnitude: 2 % for an extent (a percentile estimated from a subset),
  // 1e-6 for anything else (a constant such as rho_inf = 1 allows round-off,
  // not 1.2). A description the envelope lacks, or a sample lacks, is not
  // judged.
  std::vector<OutOfRange> outside(const Sample& sample, double margin = 0.05) const;

  // {"samples": N, "ranges": {name: [min, max]}}; from_json throws on any
  // other shape.
  nlohmann::json to_json() const;
  static SampleEnvelope from_json(const nlohmann::json& j);

 private:
  int64_t samples_ = 0;
  std::map<std::string, std::pair<double, double>> ranges_;
};

// The envelope of every sample of `dataset`, each read through a
// PointRequest of `points` random rows (a large volume is not read whole,
// where the dataset can read rows alone).
SampleEnvelope envelope_of(const Dataset& dataset, int64_t points = 16384);

// "phi 45 (trained 0 to 40)", joined by "; ".
std::string describe_out_of_range(const std::vector<OutOfRange>& outside);

}  // namespace slipstream::aero
