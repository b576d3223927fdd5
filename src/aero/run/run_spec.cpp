#include "aero/run/run_spec.h"

#include "aero/ops/domain_parallel.h"
#include "aero/ops/fp8_linear.h"
#include "core/process/host_memory.h"
#include "core/text/join.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>

namespace slipstream::aero {

std::string to_string(Precision precision) {
  switch (precision) {
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp8:
      return "fp8";
    case Precision::kFp32:
      break;
  }
  return "fp32";
}

Precision parse_precision(const std::string& name) {
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp32") return Precision::kFp32;
  if (name == "fp8") return Precision::kFp8;
  TORCH_CHECK(false, "precision: '", name, "' is not one of fp32, bf16, fp8");
}

Precision decide_precision(const std::string& setting, c10::Device device) {
  if (setting == "auto") return device.is_cuda() ? Precision::kBf16 : Precision::kFp32;
  const Precision p = parse_precision(setting);
  TORCH_CHECK(p != Precision::kBf16 || device.is_cuda(),
              "config: precision 'bf16' needs a CUDA device (CPU runs in fp32)");
  if (p == Precision::kFp8) {
    const std::string why = fp8::unsupported(device);
    TORCH_CHECK(why.empty(), "config: precision 'fp8' cannot run here: ", why,
                "; use precision=bf16");
  }
  return p;
}

Precision inference_precision(Precision trained, c10::Device device) {
  if (!device.is_cuda()) return Precision::kFp32;
  if (trained == Precision::kFp8 && !fp8::unsupported(device).empty()) return Precision::kBf16;
  return trained;
}

RunSpec resolve_run_spec(const Config& config) {
  RunSpec spec;
  spec.settings = resolve_settings(config);
  spec.fields = resolve_fields(config);
  spec.inputs = InputSpec::from_yaml(config.section("model.inputs"), "model.inputs");
  if (config.has("defaults.model")) spec.model_config = config.get<std::string>("defaults.model");
  for (const auto& [name, sub] : config.extra_dataset_configs()) {
    ExtraDataset extra;
    extra.name = name;
    extra.settings = resolve_settings(sub);
    extra.fields = resolve_fields(sub);
    spec.extra_datasets.push_back(std::move(extra));
  }
  return spec;
}

namespace {

std::string join_keys(const std::map<std::string, int64_t>& m) {
  std::string out;
  for (const auto& [k, v] : m) out += (out.empty() ? "" : ", ") + k;
  return out;
}

// Everything a run reads of each sample: the inputs' tensors, the targets,
// the coordinates, the free stream and the loss weights.
SampleCheck sample_check(const RunSpec& spec, const SampleLayout& layout) {
  SampleCheck check;
  check.required = spec.inputs.required(layout);
  check.required.point_channels["points"] = 3;
  for (const auto& f : spec.fields.fields()) check.required.point_channels[f.name] = f.channels();
  if (!spec.settings.weight_field.empty()) {
    check.required.point_channels[spec.settings.weight_field] = 1;
  }
  if (spec.settings.force_loss.enabled()) {
    check.required.point_channels["normals"] = 3;
    check.required.point_channels["area"] = 1;
  }
  check.required.global_sizes["U_inf"] = 3;
  check.targets = spec.fields.names();
  check.allow_nonfinite_targets = spec.settings.mask_nonfinite;
  return check;
}

std::string describe_fields(const FieldSchema& fields) {
  std::string out;
  for (const auto& f : fields.fields()) {
    out += (out.empty() ? "" : ", ") + f.name + ": " + to_string(f.type) + " (" +
           to_string(f.nondim) + ", mean " + std::to_string(f.mean.empty() ? 0.0 : f.mean[0]) +
           ", std " + std::to_string(f.std_dev) + ")";
  }
  return out;
}

// An extra dataset trains the same model on the same targets, transformed
// the same way: Slipstream applies one field schema and one transform
// chain to every sample of a run.
void check_extra_dataset(const RunSpec& spec, const ExtraDataset& extra) {
  const auto& s = spec.settings;
  const auto& e = extra.settings;
  const std::string where = "config: extra dataset '" + extra.name + "'";
  TORCH_CHECK(e.dataset_kind == s.dataset_kind, where, " holds ", e.dataset_kind,
              " samples but the run's dataset holds ", s.dataset_kind, " ones");
  auto names_types = [](const FieldSchema& f) {
    std::string out;
    for (const auto& x : f.fields()) out += x.name + ":" + to_string(x.type) + " ";
    return out;
  };
  TORCH_CHECK(names_types(extra.fields) == names_types(spec.fields), where, " declares targets [",
              describe_fields(extra.fields), "], which differ from the dataset's [",
              describe_fields(spec.fields),
              "]; every dataset of a run must declare the same targets (names, types, order)");
  TORCH_CHECK(describe_fields(extra.fields) == describe_fields(spec.fields), where,
              " non-dimensionalises or normalises its targets differently [",
              describe_fields(extra.fields), "] from the dataset [", describe_fields(spec.fields),
              "]; a run applies one field schema to every dataset");
  const auto& a = e.transforms;
  const auto& b = s.transforms;
  TORCH_CHECK(a.subsample == b.subsample && a.center == b.center &&
                  a.scale_by_L_ref == b.scale_by_L_ref &&
                  a.rotate_z_max_deg == b.rotate_z_max_deg && a.translate_max == b.translate_max,
              where,
              " sets dataset.transforms differently from the run's dataset; a run applies "
              "one transform chain to every dataset");
  const auto shear = [](const TrainSettings& t) {
    return t.forces.shear ? to_string(*t.forces.shear) : std::string("undeclared");
  };
  TORCH_CHECK(shear(e) == shear(s), where, " declares dataset.shear_stress ", shear(e),
              " but the run's dataset ", shear(s),
              "; one model learns one meaning of the shear field (convert one dataset's sign)");
}

}  // namespace

ModelShape model_shape(const RunSpec& spec, const SampleLayout& layout) {
  for (const auto& f : spec.fields.fields()) {
    auto it = layout.point_channels.find(f.name);
    TORCH_CHECK(it != layout.point_channels.end(), "dataset: target '", f.name,
                "' (dataset.targets) is not a field of the samples; they hold: ",
                join_keys(layout.point_channels));
    TORCH_CHECK(it->second == f.channels(), "dataset: target '", f.name, "' is declared a ",
                to_string(f.type), " (", f.channels(), " channels) but the samples hold ",
                it->second);
  }
  ModelShape shape;
  try {
    shape.input_widths = spec.inputs.widths(layout);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, e.what_without_backtrace(), "; the ", spec.settings.dataset_kind,
                " samples hold: ", join_keys(layout.point_channels),
                " (a surface model reads a surface dataset, e.g. dataset=synthetic_surface;"
                " a volume model a volume one)");
  }
  shape.out_dim = spec.fields.total_channels();
  return shape;
}

namespace {
// Synthetic samples are made and kept in memory: more than the machine has
// is named by its keys before any is made.
void check_synthetic_fits(const TrainSettings& d) {
  const uint64_t available = available_host_memory();
  if (available == 0) return;
  double per_point = 0;
  for (const auto& [name, channels] : synthetic_layout(d.synthetic.kind).point_channels) {
    per_point += 4.0 * static_cast<double>(channels);
  }
  const double points = static_cast<double>(d.synthetic.points_per_sample);
  const double one = points * per_point;
  const double all = one * static_cast<double>(d.num_train + d.num_val);
  const double avail = static_cast<double>(available);
  TORCH_CHECK(one <= avail, "config: dataset.points_per_sample=", d.synthetic.points_per_sample,
              " needs about ", format_gib(one), " a sample, more than the ", format_gib(avail),
              " this machine has available");
  TORCH_CHECK(all <= avail, "config: dataset.num_train=", d.num_train,
              " and dataset.num_val=", d.num_val, " synthetic samples of ",
              d.synthetic.points_per_sample, " points are kept in memory: about ", format_gib(all),
              ", more than the ", format_gib(avail),
              " this machine has available; use fewer, or write them to disk with "
              "`slipstream make-synthetic --out DIR` and train with dataset.path=DIR");
}

// One dataset's train and val: synthetic in memory, or its source's
// manifest splits `train_split` and `val_split`.
DatasetSplits splits_of(const TrainSettings& d, const std::string& train_split,
                        const std::string& val_split) {
  if (!d.synthetic_data()) return open_dataset(d.data, train_split, val_split);
  check_synthetic_fits(d);
  TORCH_CHECK(train_split == "train" && (val_split.empty() || val_split == "val"),
              "config: the synthetic dataset in memory has splits train and val; train_split is '",
              train_split, "', val_split '", val_split,
              "' (val_split=null validates on nothing; a directory's manifest may name others)");
  DatasetSplits out;
  out.train = std::make_shared<SyntheticDataset>(d.synthetic, 0, d.num_train);
  out.val = std::make_shared<SyntheticDataset>(d.synthetic, d.num_train,
                                               val_split.empty() ? 0 : d.num_val);
  return out;
}
}  // namespace

DatasetSplits open_datasets(const RunSpec& spec) {
  const auto& s = spec.settings;
  DatasetSplits data = splits_of(s, s.train_split, s.val_split);
  if (!spec.extra_datasets.empty()) {
    std::vector<std::shared_ptr<Dataset>> train{data.train}, val{data.val};
    for (const auto& extra : spec.extra_datasets) {
      check_extra_dataset(spec, extra);
      const DatasetSplits more = splits_of(extra.settings, s.train_split, s.val_split);
      train.push_back(more.train);
      val.push_back(more.val);
    }
    data.train = std::make_shared<ConcatDataset>(train);
    data.val = std::make_shared<ConcatDataset>(val);
  }
  const SampleLayout layout = data.train->layout();
  model_shape(spec, layout);  // the samples hold every target and input
  const SampleCheck check = sample_check(spec, layout);
  data.train->set_check(check);
  data.val->set_check(check);
  data.train->check_headers();
  data.val->check_headers();
  return data;
}

std::shared_ptr<Dataset> open_named_split(const RunSpec& spec, const std::string& split,
                                          const std::string& dir) {
  const auto& s = spec.settings;
  if (!dir.empty() || !s.synthetic_data()) {
    DatasetSource source = s.data;
    if (!dir.empty()) {  // another directory of the same kind: its own manifest
      source.path = dir;
      source.manifest.clear();
    }
    return open_split(source, split);
  }
  TORCH_CHECK(split == "train" || split == "val", "infer: the run's dataset is synthetic in ",
              "memory, which has splits train and val, not '", split,
              "'; give --data DIR for a sample directory");
  const DatasetSplits synthetic = splits_of(s, "train", "val");
  return split == "train" ? synthetic.train : synthetic.val;
}

LoaderOptions loader_options(const RunSpec& spec, c10::Device device) {
  LoaderOptions o;
  o.sampling_resolution = spec.settings.sampling_resolution;
  o.num_workers = spec.settings.num_workers;
  o.device = device;
  o.seed = spec.settings.seed;
  o.fields = spec.fields;
  o.inputs = spec.inputs;
  o.weight_field = spec.settings.weight_field;
  o.transforms = spec.settings.transforms;
  if (spec.settings.force_loss.enabled()) {
    const auto& f = spec.settings.forces;
    ForceLossFrame frame;
    frame.coefficients = spec.settings.force_loss.coefficients;
    frame.shear = f.shear.value_or(ShearConvention::kWallOnFluid);
    frame.up_direction = f.up_direction;
    frame.reference_area = f.reference_area;
    o.force_loss = frame;
  }
  return o;
}

SampleDomain sample_domain(const TrainSettings& settings) {
  return settings.dataset_kind == "surface" ? SampleDomain::kSurface : SampleDomain::kVolume;
}

const char* point_noun(SampleDomain domain) {
  return domain == SampleDomain::kSurface ? "cells" : "points";
}

}  // namespace slipstream::aero
