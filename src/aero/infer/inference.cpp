#include "aero/infer/inference.h"

#include "core/device/device.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>

namespace slipstream::aero {

std::map<std::string, double> surface_forces(const Sample& s, const torch::Tensor& physical,
                                             const FieldSchema& fields,
                                             const ForceSettings& settings) {
  const ForceFields which = force_fields(fields);
  TORCH_CHECK(which.available(), "forces: the targets (", fields.names().size(),
              ") need a scalar with nondim 'pressure' and a vector with nondim 'stress'");
  TORCH_CHECK(s.has_point("normals") && s.has_point("area"), "forces: sample '", s.id,
              "' is not a surface sample (it has no normals and area per cell)");
  const FreeStream fs = s.free_stream();
  const double q = fs.dynamic_pressure();
  TORCH_CHECK(q > 0, "forces: sample '", s.id, "' has a zero free-stream dynamic pressure");
  const auto p =
      physical.narrow(1, fields.offset(static_cast<size_t>(which.pressure)), 1).to(torch::kDouble);
  const auto tau =
      physical.narrow(1, fields.offset(static_cast<size_t>(which.wss)), 3).to(torch::kDouble);
  const auto u = s.global("U_inf").to(torch::kDouble);
  const Vec3 flow{u[0].item<double>(), u[1].item<double>(), u[2].item<double>()};
  const ForceOptions o =
      settings.for_sample(s.id, s.global_scalar("A_ref", 0.0), s.global_scalar("L_ref", 0.0));
  return force_coefficients(s.point("points"), s.point("normals"), s.point("area"), (p - fs.p) / q,
                            tau / q, flow, o);
}

namespace {
torch::Tensor predict_fitting(const TrainedModel& trained, const Sample& sample, bool surface,
                              int64_t& chunks) {
  const int64_t n = sample.num_points();
  int64_t chunk = surface ? n : std::max<int64_t>(1, trained.spec.settings.sampling_resolution);
  while (true) {
    try {
      chunks = (n + chunk - 1) / chunk;
      return trained.predict(sample, chunk);
    } catch (const c10::OutOfMemoryError&) {
      // Over ranks, one rank alone retrying would leave the others waiting.
      TORCH_CHECK(surface && chunk > 1024 && trained.domain_group == nullptr, "infer: sample '",
                  sample.id, "' does not fit on the device in chunks of ", chunk, " points");
      chunk = (chunk + 1) / 2;
      empty_device_cache(trained.device);
    }
  }
}
}  // namespace

SampleInference infer_sample(const TrainedModel& trained, const Sample& sample) {
  const bool surface = sample.has_point("normals") && sample.has_point("area");
  // What train refuses, infer refuses: non-finite coordinates, inputs or
  // free stream (one NaN makes every point's prediction NaN).
  SampleLayout inputs = trained.spec.inputs.required(layout_of(sample));
  inputs.point_channels["points"] = 3;
  inputs.global_sizes["U_inf"] = 3;
  validate_sample(sample, inputs, {}, false);
  SampleInference r;
  r.id = sample.id;
  r.points = sample.num_points();
  reset_peak_memory(trained.device);
  const auto t0 = std::chrono::steady_clock::now();
  r.prediction = predict_fitting(trained, sample, surface, r.chunks);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Finite inputs far outside the training data can still overflow.
  const int64_t bad = (~torch::isfinite(r.prediction)).any(1).sum().item<int64_t>();
  TORCH_CHECK(bad == 0, "infer: the prediction for sample ", sample.id, " is not finite at ", bad,
              " of ", r.points,
              " points (inputs outside what the model can take?); nothing is "
              "written for it");
  r.peak_memory_gib = peak_memory_gib(trained.device);
  const auto& fields = trained.fields;
  std::vector<torch::Tensor> truth;
  for (size_t i = 0; i < fields.size(); ++i) {
    const auto& f = fields.fields()[i];
    const auto pred = r.prediction.narrow(1, fields.offset(i), f.channels()).to(torch::kDouble);
    const auto t = sample.point(f.name).to(torch::kDouble);
    truth.push_back(t.to(torch::kFloat));
    const auto err = pred - t;
    r.metrics[f.name + "_l2"] = (err.norm() / t.norm().clamp_min(1e-300)).item<double>();
    r.metrics[f.name + "_mae"] = err.abs().mean().item<double>();
  }
  r.envelope_known = !trained.envelope.empty();
  if (r.envelope_known) r.out_of_range = trained.envelope.outside(sample);
  const auto& forces = trained.spec.settings.forces;
  if (surface && forces.enabled && force_fields(fields).available()) {
    r.forces_pred = surface_forces(sample, r.prediction, fields, forces);
    r.forces_true = surface_forces(sample, torch::cat(truth, 1), fields, forces);
    for (const char* c : {"CD", "CL", "CS"}) {
      const std::string key = std::string(c) + "_cfd";
      if (sample.has_global(key)) r.forces_cfd[c] = sample.global_scalar(key, NAN);
    }
  }
  return r;
}

nlohmann::json infer_step_record(const SampleInference& r, size_t index) {
  nlohmann::json j{{"index", index},
                   {"sample", r.id},
                   {"points", r.points},
                   {"chunks", r.chunks},
                   {"seconds", r.seconds},
                   {"metrics", r.metrics},
                   {"peak_memory_gib", r.peak_memory_gib}};
  j["in_distribution"] = r.envelope_known ? nlohmann::json(r.out_of_range.empty()) : nullptr;
  j["out_of_distribution"] = nlohmann::json::array();
  for (const auto& o : r.out_of_range) {
    j["out_of_distribution"].push_back(
        {{"name", o.name}, {"value", o.value}, {"min", o.min}, {"max", o.max}});
  }
  if (!r.forces_pred.empty()) {
    j["forces"] = {{"pred", r.forces_pred}, {"true", r.forces_true}};
    if (!r.forces_cfd.empty()) j["forces"]["cfd"] = r.forces_cfd;
  }
  return j;
}

SplitSummary summarize_split(const std::vector<SampleInference>& results,
                             const std::string& split) {
  SplitSummary out;
  std::map<std::string, double> sums;
  double seconds = 0;
  int64_t points = 0, outside = 0;
  bool envelope_known = false;
  for (const auto& r : results) {
    for (const auto& [k, v] : r.metrics) sums[k] += v;
    seconds += r.seconds;
    points += r.points;
    outside += r.out_of_range.empty() ? 0 : 1;
    envelope_known = envelope_known || r.envelope_known;
  }
  nlohmann::json means = nlohmann::json::object();
  for (const auto& [k, v] : sums) means[k] = v / static_cast<double>(results.size());
  out.summary = {{"split", split},
                 {"samples", results.size()},
                 {"points", points},
                 {"seconds", seconds},
                 {"metrics", means},
                 {"out_of_distribution_samples",
                  envelope_known ? nlohmann::json(outside) : nlohmann::json(nullptr)}};
  std::vector<std::map<std::string, double>> pred, truth, cfd_truth, cfd;
  for (const auto& r : results) {
    if (r.forces_pred.empty()) continue;
    pred.push_back(r.forces_pred);
    truth.push_back(r.forces_true);
    if (!r.forces_cfd.empty()) {
      cfd.push_back(r.forces_cfd);
      std::map<std::string, double> integrated;
      for (const auto& [k, v] : r.forces_cfd) integrated[k] = r.forces_true.at(k);
      cfd_truth.push_back(integrated);
    }
  }
  if (pred.empty()) return out;
  out.coefficients = summarize_coefficients(pred, truth);
  nlohmann::json coeffs = nlohmann::json::object();
  for (const auto& [name, c] : out.coefficients) {
    coeffs[name] = {{"pred_mean", c.pred_mean},
                    {"true_mean", c.true_mean},
                    {"mae", c.mae},
                    {"r2", c.r2},
                    {"samples", c.samples}};
  }
  out.forces = {{"split", split}, {"samples", pred.size()}, {"coefficients", coeffs}};
  if (!cfd.empty()) {
    // The integration checked on the data: the true fields' integral
    // against the CFD's own coefficients.
    nlohmann::json check = nlohmann::json::object();
    for (const auto& [name, c] : summarize_coefficients(cfd_truth, cfd)) {
      check[name] = {{"integrated_mean", c.pred_mean},
                     {"cfd_mean", c.true_mean},
                     {"mae", c.mae},
                     {"samples", c.samples}};
    }
    out.forces["integrated_vs_cfd"] = check;
  }
  return out;
}

}  // namespace slipstream::aero
