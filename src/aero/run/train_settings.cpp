#include "aero/run/train_settings.h"

#include "aero/data/dataset_formats.h"

#include "aero/ops/numerics_settings.h"
#include "aero/run/run_directory.h"
#include "core/text/join.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <sstream>

namespace slipstream::aero {

namespace {

// A string key that may be absent (configs written before it existed) or
// null: `fallback` then.
std::string optional_string(const Config& c, const std::string& key, const std::string& fallback) {
  if (!c.has(key) || c.is_null(key)) return fallback;
  return c.get<std::string>(key);
}
std::string timestamp_run_id() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm);
  return buf;
}

// A map-valued key (name -> value), or an empty node when absent or null.
YAML::Node section(const Config& c, const std::string& key) {
  YAML::Node n = c.section(key);
  if (!n.IsDefined() || n.IsNull()) return YAML::Node();
  TORCH_CHECK(n.IsMap(), "config: '", key, "' must map target names to values");
  return n;
}

Vec3 vec3(const Config& c, const std::string& key) {
  const auto v = c.get<std::vector<double>>(key);
  TORCH_CHECK(v.size() == 3, "config: '", key, "' must be 3 numbers [x, y, z], got ", v.size());
  return {v[0], v[1], v[2]};
}

std::optional<double> positive_or_null(const Config& c, const std::string& key) {
  if (c.is_null(key)) return std::nullopt;
  const double v = c.get<double>(key);
  check_positive(key, v);
  return v;
}

ForceSettings resolve_forces(const Config& c) {
  ForceSettings f;
  f.enabled = c.get<bool>("force_coefficients.enabled");
  f.reference_area = positive_or_null(c, "force_coefficients.reference_area");
  f.reference_length = positive_or_null(c, "force_coefficients.reference_length");
  f.moment_center = vec3(c, "force_coefficients.moment_center");
  f.up_direction = vec3(c, "force_coefficients.up_direction");
  if (c.has("dataset.shear_stress")) {
    try {
      f.shear = parse_shear_convention(c.get<std::string>("dataset.shear_stress"));
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "config: 'dataset.shear_stress': ", e.what_without_backtrace());
    }
  }
  const auto& u = f.up_direction;
  TORCH_CHECK(u[0] * u[0] + u[1] * u[1] + u[2] * u[2] > 0,
              "config: 'force_coefficients.up_direction' must not be zero");
  return f;
}
}  // namespace

ForceOptions ForceSettings::for_sample(const std::string& sample_id, double sample_a_ref,
                                       double sample_l_ref) const {
  ForceOptions o;
  o.moment_center = moment_center;
  o.up_direction = up_direction;
  const double a = reference_area.value_or(sample_a_ref);
  const double l = reference_length.value_or(sample_l_ref);
  TORCH_CHECK(a > 0, "forces: sample '", sample_id,
              "' has no A_ref global; set force_coefficients.reference_area");
  TORCH_CHECK(l > 0, "forces: sample '", sample_id,
              "' has no L_ref global; set force_coefficients.reference_length");
  TORCH_CHECK(shear.has_value(), "forces: sample '", sample_id,
              "': the config does not say what its shear field means; set "
              "dataset.shear_stress=wall_on_fluid (OpenFOAM's wallShearStress, DrivAerML) or "
              "fluid_on_wall");
  o.reference_area = a;
  o.reference_length = l;
  o.shear = *shear;
  return o;
}

FieldSchema resolve_fields(const Config& c) {
  const YAML::Node targets = section(c, "dataset.targets");
  TORCH_CHECK(targets && targets.size() > 0,
              "config: 'dataset.targets' must map each target field to its type, e.g. "
              "{velocity: vector, pressure: scalar, nut: scalar}");
  std::vector<FieldSpec> fields;
  std::vector<std::string> names;
  for (const auto& kv : targets) {
    FieldSpec f;
    f.name = kv.first.as<std::string>();
    const std::string key = "dataset.targets." + f.name;
    TORCH_CHECK(kv.second.IsScalar(), "config: '", key, "' must be scalar or vector");
    try {
      f.type = parse_field_type(kv.second.as<std::string>());
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "config: '", key, "': ", e.what_without_backtrace());
    }
    names.push_back(f.name);
    fields.push_back(std::move(f));
  }
  auto field_of = [&](const std::string& map_key, const std::string& name) -> FieldSpec& {
    for (auto& f : fields) {
      if (f.name == name) return f;
    }
    TORCH_CHECK(false, "config: '", map_key, ".", name, "': '", name,
                "' is not a target field (dataset.targets: ", join(names), ")");
  };
  for (const auto& kv : section(c, "dataset.nondim")) {
    const auto name = kv.first.as<std::string>();
    FieldSpec& f = field_of("dataset.nondim", name);
    try {
      f.nondim = parse_nondim(kv.second.as<std::string>());
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "config: 'dataset.nondim.", name, "': ", e.what_without_backtrace());
    }
  }
  for (const auto& kv : section(c, "dataset.normalization")) {
    const auto name = kv.first.as<std::string>();
    const std::string key = "dataset.normalization." + name;
    FieldSpec& f = field_of("dataset.normalization", name);
    TORCH_CHECK(kv.second.IsMap(), "config: '", key, "' must be {mean: ..., std: ...}");
    for (const auto& e : kv.second) {
      const auto k = e.first.as<std::string>();
      TORCH_CHECK(k == "mean" || k == "std", "config: unknown key '", key, ".", k,
                  "' (a normalization takes mean and std)");
    }
    try {
      const YAML::Node mean = kv.second["mean"];
      if (mean) {
        f.mean = mean.IsSequence() ? mean.as<std::vector<double>>()
                                   : std::vector<double>{mean.as<double>()};
      }
      if (kv.second["std"]) f.std_dev = kv.second["std"].as<double>();
    } catch (const YAML::Exception&) {
      TORCH_CHECK(false, "config: '", key,
                  "' must hold numbers: mean (one, or one per component) and std");
    }
  }
  for (const auto& kv : section(c, "loss.field_weights")) {
    const auto name = kv.first.as<std::string>();
    FieldSpec& f = field_of("loss.field_weights", name);
    try {
      f.loss_weight = kv.second.as<double>();
    } catch (const YAML::Exception&) {
      TORCH_CHECK(false, "config: 'loss.field_weights.", name, "' must be a number");
    }
  }
  try {
    return FieldSchema(std::move(fields));
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "config: ", e.what_without_backtrace());
  }
}

CudaGraphMode parse_cuda_graph_mode(const std::string& value) {
  if (value == "auto") return CudaGraphMode::kAuto;
  if (value == "true") return CudaGraphMode::kOn;
  if (value == "false") return CudaGraphMode::kOff;
  TORCH_CHECK(false, "config: 'training.cuda_graph' must be auto, true or false, got '", value,
              "'");
}

TrainSettings resolve_settings(const Config& c) {
  TrainSettings s;
  s.run_id = c.is_null("run_id") ? timestamp_run_id() : c.get<std::string>("run_id");
  check_run_id(s.run_id);
  s.output_dir = c.get<std::string>("output_dir");
  s.seed = static_cast<uint64_t>(c.get<int64_t>("seed"));
  s.device = c.get<std::string>("device");
  check_one_of("device", s.device, {"auto", "cpu", "cuda"});
  s.precision = c.get<std::string>("precision");
  check_one_of("precision", s.precision, {"auto", "fp32", "bf16", "fp8"});
  numerics_settings(c);  // checked here with the rest; build_run applies it
  s.num_epochs = c.get<int64_t>("training.num_epochs");
  check_positive("training.num_epochs", static_cast<double>(s.num_epochs));
  s.save_interval = c.get<int64_t>("training.save_interval");
  check_positive("training.save_interval", static_cast<double>(s.save_interval));
  s.keep_last = c.get<int64_t>("training.keep_last");
  TORCH_CHECK(s.keep_last >= 2, "config: 'training.keep_last' must be >= 2 (the newest checkpoint ",
              "and one before it), got ", s.keep_last);
  s.keep_best = !c.has("training.keep_best") || c.get<bool>("training.keep_best");
  const std::string resume = c.get<std::string>("training.resume");
  check_one_of("training.resume", resume, {"auto", "true", "false"});
  s.resume = resume != "false";
  s.resume_auto = resume == "auto";
  s.start_over = c.get<bool>("training.start_over");
  s.validate = c.get<bool>("training.validate");
  s.memory_check = !c.has("training.memory_check") || c.get<bool>("training.memory_check");
  s.steps_per_epoch = c.get<int64_t>("training.steps_per_epoch");
  TORCH_CHECK(s.steps_per_epoch >= 0, "config: 'training.steps_per_epoch' must be >= 0");
  s.recompute.mode = parse_recompute(optional_string(c, "training.recompute", "none"));
  if (c.has("training.recompute_chunk")) {
    s.recompute.point_chunk = c.get<int64_t>("training.recompute_chunk");
    TORCH_CHECK(s.recompute.point_chunk >= 0,
                "config: 'training.recompute_chunk' must be >= 0 (0: no chunks)");
  }
  s.readback = parse_readback_policy(c.get<std::string>("training.readback"));
  s.cuda_graph = parse_cuda_graph_mode(optional_string(c, "training.cuda_graph", "auto"));

  s.optimizer.name = c.get<std::string>("optimizer.name");
  check_one_of("optimizer.name", s.optimizer.name, {"muon", "adamw"});
  s.optimizer.lr = c.get<double>("optimizer.lr");
  check_positive("optimizer.lr", s.optimizer.lr);
  s.optimizer.weight_decay = c.get<double>("optimizer.weight_decay");
  TORCH_CHECK(s.optimizer.weight_decay >= 0, "config: 'optimizer.weight_decay' must be >= 0");

  s.scheduler = c.get<std::string>("scheduler.name");
  check_one_of("scheduler.name", s.scheduler, {"steplr", "none"});
  s.scheduler_step_size = c.get<int64_t>("scheduler.step_size");
  check_positive("scheduler.step_size", static_cast<double>(s.scheduler_step_size));
  s.scheduler_gamma = c.get<double>("scheduler.gamma");
  check_positive("scheduler.gamma", s.scheduler_gamma);
  const auto interval = c.get<std::string>("scheduler.interval");
  check_one_of("scheduler.interval", interval, {"epoch", "step"});
  s.scheduler_per_step = interval == "step";

  s.loss_type = c.get<std::string>("loss.type");
  check_one_of("loss.type", s.loss_type, {"huber", "mse", "rmse"});
  s.mask_nonfinite = c.get<bool>("loss.mask_nonfinite");
  s.metrics = c.get<std::vector<std::string>>("loss.metrics");
  for (const auto& m : s.metrics) check_one_of("loss.metrics", m, {"l1", "l2", "mae"});
  const auto weighting = c.get<std::string>("loss.weighting");
  check_one_of("loss.weighting", weighting, {"none", "volume", "area"});
  s.weight_field = weighting == "none" ? "" : weighting;
  if (c.has("loss.forces") && !c.is_null("loss.forces")) {
    s.force_loss.weight = c.get<double>("loss.forces.weight");
    s.force_loss.scale = c.get<double>("loss.forces.scale");
    s.force_loss.coefficients = c.get<std::vector<std::string>>("loss.forces.coefficients");
    check_force_loss(s.force_loss);
  }
  s.console_every_n_steps = c.get<int>("logging.console_every_n_steps");
  check_positive("logging.console_every_n_steps", s.console_every_n_steps);
  s.tensorboard = c.get<bool>("logging.tensorboard");
  s.distributed_timeout_s = c.get<int64_t>("distributed.timeout_s");
  check_positive("distributed.timeout_s", static_cast<double>(s.distributed_timeout_s));
  s.domain_parallel = c.get<int64_t>("distributed.domain_parallel");
  check_positive("distributed.domain_parallel", static_cast<double>(s.domain_parallel));

  const auto dataset_name = c.get<std::string>("dataset.name");
  check_one_of("dataset.name", dataset_name, {"synthetic", "prepared", "pdmsh"});
  s.data = resolve_dataset_source(c);
  TORCH_CHECK(dataset_name == "synthetic" || !s.data.path.empty(), "config: dataset '",
              dataset_name, "' needs dataset.path=DIR (written by slipstream prepare",
              dataset_name == "pdmsh" ? ", or PhysicsNeMo-Curator's run_*/*.pdmsh tree" : "", ")");
  s.train_split = optional_string(c, "train_split", "train");
  s.val_split = !c.has("val_split") ? "val" : optional_string(c, "val_split", "");
  TORCH_CHECK(!s.train_split.empty(), "config: 'train_split' must name a split of the manifest");
  s.transforms.subsample = c.get<std::string>("dataset.transforms.subsample");
  check_one_of("dataset.transforms.subsample", s.transforms.subsample, {"random", "block"});
  s.transforms.center = c.get<bool>("dataset.transforms.center");
  s.transforms.scale_by_L_ref = c.get<bool>("dataset.transforms.scale_by_L_ref");
  s.transforms.rotate_z_max_deg = c.get<double>("dataset.transforms.rotate_z_max_deg");
  s.transforms.translate_max = c.get<double>("dataset.transforms.translate_max");
  TORCH_CHECK(s.transforms.rotate_z_max_deg >= 0 && s.transforms.translate_max >= 0,
              "config: dataset.transforms.rotate_z_max_deg and translate_max must be >= 0");
  s.num_train = c.get<int64_t>("dataset.num_train");
  s.num_val = c.get<int64_t>("dataset.num_val");
  check_positive("dataset.num_train", static_cast<double>(s.num_train));
  TORCH_CHECK(s.num_val >= 0, "config: 'dataset.num_val' must be >= 0");
  s.synthetic.points_per_sample = c.get<int64_t>("dataset.points_per_sample");
  check_positive("dataset.points_per_sample", static_cast<double>(s.synthetic.points_per_sample));
  s.synthetic.seed = static_cast<uint64_t>(c.get<int64_t>("dataset.seed"));
  s.sampling_resolution = c.get<int64_t>("dataset.sampling_resolution");
  check_positive("dataset.sampling_resolution", static_cast<double>(s.sampling_resolution));
  // Absent (configs older than the key), null or "auto": auto.
  const std::string workers = optional_string(c, "dataset.num_workers", "auto");
  if (workers != "auto") {
    try {
      size_t used = 0;
      s.num_workers = std::stoi(workers, &used);
      TORCH_CHECK(used == workers.size() && s.num_workers >= 1, "");
    } catch (...) {
      TORCH_CHECK(false, "config: 'dataset.num_workers' is '", workers,
                  "', expected auto or a number of threads >= 1");
    }
  }
  s.shuffle = c.get<bool>("dataset.shuffle");
  s.dataset_kind = resolve_dataset_kind(c);
  s.synthetic.kind = s.dataset_kind;
  if (c.has("force_coefficients")) s.forces = resolve_forces(c);
  if (s.force_loss.enabled()) {
    TORCH_CHECK(s.dataset_kind == "surface",
                "config: 'loss.forces' integrates forces over a "
                "surface; dataset.kind is ",
                s.dataset_kind);
    TORCH_CHECK(s.forces.shear.has_value(),
                "config: 'loss.forces' needs dataset.shear_stress "
                "(wall_on_fluid for OpenFOAM's wallShearStress and DrivAerML, or fluid_on_wall)");
  }
  return s;
}

DatasetSource resolve_dataset_source(const Config& c) {
  DatasetSource d;
  d.path = optional_string(c, "dataset.path", "");
  d.format = optional_string(c, "dataset.format", "auto");
  check_one_of("dataset.format", d.format, dataset_format_choices());
  d.manifest = optional_string(c, "dataset.manifest", "");
  d.train_manifest = optional_string(c, "dataset.train_manifest", "");
  d.val_manifest = optional_string(c, "dataset.val_manifest", "");
  d.pdmsh.kind = resolve_dataset_kind(c);
  d.pdmsh.pattern = optional_string(c, "dataset.pdmsh.pattern", d.pdmsh.pattern);
  d.pdmsh.geometry = optional_string(c, "dataset.pdmsh.geometry", "");
  if (!c.has("dataset.pdmsh.geometry")) d.pdmsh.geometry = PdmshOptions{}.geometry;
  d.pdmsh.boundary = optional_string(c, "dataset.pdmsh.boundary", d.pdmsh.boundary);
  if (c.has("dataset.pdmsh.body_cache_mb") && !c.is_null("dataset.pdmsh.body_cache_mb")) {
    const int64_t mb = c.get<int64_t>("dataset.pdmsh.body_cache_mb");
    TORCH_CHECK(mb >= 0, "config: 'dataset.pdmsh.body_cache_mb' must be >= 0, not ", mb);
    d.pdmsh.body_cache_bytes = static_cast<size_t>(mb) << 20;
  }
  const YAML::Node fields =
      c.has("dataset.pdmsh.fields") ? c.section("dataset.pdmsh.fields") : YAML::Node();
  if (fields.IsDefined() && !fields.IsNull()) {
    TORCH_CHECK(fields.IsMap(),
                "config: 'dataset.pdmsh.fields' must map a field name in the "
                "files to a target name, e.g. {UMeanTrim: velocity}");
    for (const auto& kv : fields) {
      d.pdmsh.fields[kv.first.as<std::string>()] = kv.second.as<std::string>();
    }
  }
  return d;
}

std::string resolve_dataset_kind(const Config& c) {
  if (!c.has("dataset.kind")) return "volume";
  auto kind = c.get<std::string>("dataset.kind");
  check_one_of("dataset.kind", kind, {"volume", "surface"});
  return kind;
}

double scheduled_lr(const TrainSettings& s, int64_t t) {
  if (s.scheduler == "none") return s.optimizer.lr;
  const int64_t periods = t / s.scheduler_step_size;  // StepLR: whole periods only
  return s.optimizer.lr * std::pow(s.scheduler_gamma, static_cast<double>(periods));
}

}  // namespace slipstream::aero
