#include "aero/data/sample_envelope.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace slipstream::aero {

namespace {
constexpr double kDegrees = 180.0 / M_PI;

constexpr int64_t kDescribedRows = 65536;

bool is_cfd_result(const std::string& name) {
  return name.size() > 4 && name.compare(name.size() - 4, 4, "_cfd") == 0;
}
}  // namespace

std::map<std::string, double> describe_sample(const Sample& s) {
  std::map<std::string, double> d;
  if (s.has_point("points") && s.num_points() > 0) {
    // A robust extent: the span between the 1st and 99th percentiles, on at
    // most kDescribedRows rows (a fixed subset), so that a training read of
    // a few thousand rows and an inference over every point agree.
    auto p = s.point("points").to(torch::kDouble);
    if (p.size(0) > kDescribedRows) {
      auto gen = at::detail::createCPUGenerator(20261205);
      p = p.index_select(
          0, torch::randperm(p.size(0), gen, torch::kLong).narrow(0, 0, kDescribedRows));
    }
    const auto q = torch::quantile(p, torch::tensor({0.01, 0.99}, torch::kDouble), 0);  // (2, 3)
    const auto extent = (q[1] - q[0]).contiguous();
    const double* e = extent.data_ptr<double>();
    d["extent_x"] = e[0];
    d["extent_y"] = e[1];
    d["extent_z"] = e[2];
  }
  for (const auto& [name, t] : s.global_data) {
    if (name == "U_inf" && t.numel() == 3) {
      const auto u = t.to(torch::kDouble).contiguous();
      const double* v = u.data_ptr<double>();
      const double speed = std::sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
      d["U_inf_speed"] = speed;
      d["U_inf_yaw_deg"] = std::atan2(v[1], v[0]) * kDegrees;
      d["U_inf_pitch_deg"] = speed > 0 ? std::asin(v[2] / speed) * kDegrees : 0.0;
    } else if (t.numel() == 1 && !is_cfd_result(name)) {
      d[name] = t.to(torch::kDouble).item<double>();
    }
  }
  return d;
}

void SampleEnvelope::add(const Sample& sample) {
  const auto d = describe_sample(sample);
  if (samples_ == 0) {
    for (const auto& [name, v] : d) {
      if (std::isfinite(v)) ranges_[name] = {v, v};
    }
  } else {
    // Only what every sample has describes the set.
    for (auto it = ranges_.begin(); it != ranges_.end();) {
      const auto found = d.find(it->first);
      if (found == d.end() || !std::isfinite(found->second)) {
        it = ranges_.erase(it);
        continue;
      }
      it->second.first = std::min(it->second.first, found->second);
      it->second.second = std::max(it->second.second, found->second);
      ++it;
    }
  }
  ++samples_;
}

std::vector<OutOfRange> SampleEnvelope::outside(const Sample& sample, double margin) const {
  std::vector<OutOfRange> out;
  for (const auto& [name, v] : describe_sample(sample)) {
    auto it = ranges_.find(name);
    if (it == ranges_.end()) continue;
    const auto [lo, hi] = it->second;
    // An extent is a percentile estimated from a subset: 2 % of its size is
    // sampling noise. Anything else is exact: round-off only.
    const double relative = name.rfind("extent_", 0) == 0 ? 0.02 : 1e-6;
    const double slack =
        margin * (hi - lo) + relative * std::max({std::abs(lo), std::abs(hi), 1e-12});
    if (!(v >= lo - slack && v <= hi + slack)) out.push_back({name, v, lo, hi});
  }
  return out;
}

nlohmann::json SampleEnvelope::to_json() const {
  nlohmann::json ranges = nlohmann::json::object();
  for (const auto& [name, r] : ranges_) ranges[name] = {r.first, r.second};
  return {{"samples", samples_}, {"ranges", ranges}};
}

SampleEnvelope SampleEnvelope::from_json(const nlohmann::json& j) {
  SampleEnvelope e;
  TORCH_CHECK(
      j.is_object() && j.contains("samples") && j.contains("ranges") && j["ranges"].is_object(),
      "envelope: expected {\"samples\": N, \"ranges\": {...}}, got ", j.dump());
  e.samples_ = j["samples"].get<int64_t>();
  for (const auto& [name, r] : j["ranges"].items()) {
    TORCH_CHECK(r.is_array() && r.size() == 2 && r[0].is_number() && r[1].is_number(),
                "envelope: range '", name, "' must be [min, max], got ", r.dump());
    e.ranges_[name] = {r[0].get<double>(), r[1].get<double>()};
  }
  return e;
}

SampleEnvelope envelope_of(const Dataset& dataset, int64_t points) {
  SampleEnvelope e;
  for (size_t i = 0; i < dataset.size(); ++i) {
    e.add(dataset.get(i, PointRequest{points, "random", 20261205 + i}));
  }
  return e;
}

std::string describe_out_of_range(const std::vector<OutOfRange>& outside) {
  std::ostringstream out;
  for (size_t i = 0; i < outside.size(); ++i) {
    const auto& o = outside[i];
    out << (i ? "; " : "") << o.name << " " << o.value << " (trained " << o.min << " to " << o.max
        << ")";
  }
  return out.str();
}

}  // namespace slipstream::aero
