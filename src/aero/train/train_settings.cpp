#include "aero/train/train_settings.h"

#include "aero/data/loader.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <cmath>
#include <ctime>

namespace slipstream::aero {

namespace {
std::string timestamp_run_id() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm);
  return buf;
}

void check_one_of(const std::string& key, const std::string& value,
                  std::initializer_list<const char*> allowed) {
  std::string list;
  for (const char* a : allowed) {
    if (value == a) return;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  TORCH_CHECK(false, "config: '", key, "' is '", value, "', expected one of: ", list);
}

void check_positive(const std::string& key, double v) {
  TORCH_CHECK(v > 0, "config: '", key, "' must be > 0, got ", v);
}
}  // namespace

std::vector<TargetField> target_fields(const std::vector<std::string>& names) {
  std::vector<TargetField> out;
  for (const auto& n : names) out.push_back({n, n == "velocity" ? 3 : 1, 1.0});
  return out;
}

TransolverOptions resolve_model_options(const Config& c) {
  check_one_of("model.name", c.get<std::string>("model.name"), {"transolver"});
  TransolverOptions m;
  m.functional_dim = c.get<int64_t>("model.functional_dim");
  m.embedding_dim = c.get<int64_t>("model.embedding_dim");
  m.out_dim = c.get<int64_t>("model.out_dim");
  m.n_layers = c.get<int64_t>("model.n_layers");
  m.n_hidden = c.get<int64_t>("model.n_hidden");
  m.n_head = c.get<int64_t>("model.n_head");
  m.slice_num = c.get<int64_t>("model.slice_num");
  m.mlp_ratio = c.get<int64_t>("model.mlp_ratio");
  m.fused_attention = c.get<bool>("model.fused_attention");
  m.bf16_layer_norm = c.get<bool>("model.bf16_layer_norm");
  for (auto [k, v] : {std::pair{"model.n_layers", m.n_layers}, {"model.n_hidden", m.n_hidden},
                      {"model.n_head", m.n_head}, {"model.slice_num", m.slice_num},
                      {"model.mlp_ratio", m.mlp_ratio}, {"model.out_dim", m.out_dim}}) {
    check_positive(k, static_cast<double>(v));
  }
  TORCH_CHECK(m.n_hidden % m.n_head == 0, "config: 'model.n_hidden' (", m.n_hidden,
              ") must be divisible by 'model.n_head' (", m.n_head, ")");
  TORCH_CHECK(m.embedding_dim == 7 && m.functional_dim == 3,
              "config: the loader builds embedding_dim 7 (points, sdf, normals) and "
              "functional_dim 3 (U_inf); got ", m.embedding_dim, " and ", m.functional_dim);
  return m;
}

TrainSettings resolve_settings(const Config& c) {
  TrainSettings s;
  s.run_id = c.is_null("run_id") ? timestamp_run_id() : c.get<std::string>("run_id");
  TORCH_CHECK(!s.run_id.empty() && s.run_id.find('/') == std::string::npos,
              "config: 'run_id' must be a non-empty name without '/', got '", s.run_id, "'");
  s.output_dir = c.get<std::string>("output_dir");
  s.seed = static_cast<uint64_t>(c.get<int64_t>("seed"));
  s.device = c.get<std::string>("device");
  check_one_of("device", s.device, {"auto", "cpu", "cuda"});
  s.precision = c.get<std::string>("precision");
  check_one_of("precision", s.precision, {"auto", "fp32", "bf16"});
  s.num_epochs = c.get<int64_t>("training.num_epochs");
  check_positive("training.num_epochs", static_cast<double>(s.num_epochs));
  s.save_interval = c.get<int64_t>("training.save_interval");
  check_positive("training.save_interval", static_cast<double>(s.save_interval));
  s.resume = c.get<bool>("training.resume");
  s.validate = c.get<bool>("training.validate");
  s.steps_per_epoch = c.get<int64_t>("training.steps_per_epoch");
  TORCH_CHECK(s.steps_per_epoch >= 0, "config: 'training.steps_per_epoch' must be >= 0");
  s.readback = parse_readback_policy(c.get<std::string>("training.readback"));

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

  s.targets = c.get<std::vector<std::string>>("dataset.targets");
  TORCH_CHECK(!s.targets.empty(), "config: 'dataset.targets' is empty");
  s.loss.type = c.get<std::string>("loss.type");
  check_one_of("loss.type", s.loss.type, {"huber", "mse", "rmse"});
  s.loss.mask_nonfinite = c.get<bool>("loss.mask_nonfinite");
  s.loss.fields = target_fields(s.targets);
  const auto weighting = c.get<std::string>("loss.weighting");
  check_one_of("loss.weighting", weighting, {"none", "volume"});
  s.volume_weights = weighting == "volume";
  s.console_every_n_steps = c.get<int>("logging.console_every_n_steps");
  check_positive("logging.console_every_n_steps", s.console_every_n_steps);
  s.tensorboard = c.get<bool>("logging.tensorboard");
  s.distributed_timeout_s = c.get<int64_t>("distributed.timeout_s");
  check_positive("distributed.timeout_s", static_cast<double>(s.distributed_timeout_s));

  s.model = resolve_model_options(c);
  TORCH_CHECK(s.model.out_dim == total_channels(s.loss.fields), "config: 'model.out_dim' is ",
              s.model.out_dim, " but 'dataset.targets' need ", total_channels(s.loss.fields),
              " channels");

  const auto dataset_name = c.get<std::string>("dataset.name");
  check_one_of("dataset.name", dataset_name, {"synthetic", "prepared"});
  s.dataset_path = c.is_null("dataset.path") ? "" : c.get<std::string>("dataset.path");
  TORCH_CHECK(dataset_name != "prepared" || !s.dataset_path.empty(),
              "config: dataset 'prepared' needs dataset.path=DIR (written by slipstream prepare)");
  s.transforms.subsample = c.get<std::string>("dataset.transforms.subsample");
  check_one_of("dataset.transforms.subsample", s.transforms.subsample, {"random", "block"});
  s.transforms.center = c.get<bool>("dataset.transforms.center");
  s.transforms.nondimensionalize = c.get<bool>("dataset.transforms.nondimensionalize");
  s.transforms.nut_mean = c.get<double>("dataset.transforms.nut_mean");
  s.transforms.nut_std = c.get<double>("dataset.transforms.nut_std");
  check_positive("dataset.transforms.nut_std", s.transforms.nut_std);
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
  s.shuffle = c.get<bool>("dataset.shuffle");
  return s;
}

LoaderOptions loader_options_for(const TrainSettings& s, c10::Device device) {
  LoaderOptions o;
  o.sampling_resolution = s.sampling_resolution;
  o.device = device;
  o.seed = s.seed;
  o.volume_weights = s.volume_weights;
  o.target_names = s.targets;
  o.transforms = s.transforms;
  return o;
}

double scheduled_lr(const TrainSettings& s, int64_t t) {
  if (s.scheduler == "none") return s.optimizer.lr;
  return s.optimizer.lr * std::pow(s.scheduler_gamma, static_cast<double>(t / s.scheduler_step_size));
}

}  // namespace slipstream::aero
