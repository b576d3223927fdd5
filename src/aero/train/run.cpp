#include "aero/train/run.h"

#include "aero/interop/mdlus.h"
#include "aero/model/numerics_settings.h"
#include "aero/ops/domain_parallel.h"
#include "aero/train/run_checkpoints.h"
#include "core/device/device.h"
#include "core/process/host_memory.h"
#include "core/text/join.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <iostream>

namespace slipstream::aero {

namespace fs = std::filesystem;

std::string to_string(Precision precision) {
  return precision == Precision::kBf16 ? "bf16" : "fp32";
}

Precision parse_precision(const std::string& name) {
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp32") return Precision::kFp32;
  TORCH_CHECK(false, "precision: '", name, "' is not one of fp32, bf16");
}

Precision decide_precision(const std::string& setting, c10::Device device) {
  if (setting == "auto") return device.is_cuda() ? Precision::kBf16 : Precision::kFp32;
  const Precision p = parse_precision(setting);
  TORCH_CHECK(p != Precision::kBf16 || device.is_cuda(),
              "config: precision 'bf16' needs a CUDA device (CPU runs in fp32)");
  return p;
}

Precision inference_precision(Precision trained, c10::Device device) {
  return device.is_cuda() ? trained : Precision::kFp32;
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

namespace {

// Rank 0's `text` on every rank.
std::string broadcast_text(Run& run, const std::string& text) {
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(run.device);
  auto size = torch::full({1}, static_cast<int64_t>(text.size()), opts);
  run.comm->broadcast(size, 0);
  const int64_t n = size.cpu().item<int64_t>();
  auto bytes = torch::zeros({std::max<int64_t>(n, 1)}, torch::kUInt8);
  if (run.rank == 0) std::copy(text.begin(), text.end(), bytes.data_ptr<uint8_t>());
  auto on_device = bytes.to(run.device);
  run.comm->broadcast(on_device, 0);
  bytes = on_device.cpu();
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()),
                     static_cast<size_t>(n));
}

// The keys whose values differ between `mine` and rank 0's config, with
// both values, for the error message.
std::string differing_keys(const std::string& mine, const std::string& root) {
  const auto a = Config::parse_resolved(mine, "this rank's config").flat();
  const auto b = Config::parse_resolved(root, "rank 0's config").flat();
  std::vector<std::string> out;
  for (const auto& [key, value] : a) {
    auto it = b.find(key);
    if (it == b.end()) {
      out.push_back(key + " (only on this rank)");
    } else if (it->second != value) {
      out.push_back(key + " '" + value + "' (rank 0: '" + it->second + "')");
    }
  }
  for (const auto& [key, value] : b) {
    if (!a.count(key)) out.push_back(key + " (only on rank 0)");
  }
  return join(out);
}

// Fails on every rank, naming the ranks whose resolved config (before run_id
// is filled in) differs from rank 0's, and on each of those the keys.
void check_same_config_on_every_rank(Run& run, const std::string& yaml) {
  const std::string root = broadcast_text(run, yaml);
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(run.device);
  auto differs = torch::zeros({run.world_size}, opts);
  differs[run.rank] = root == yaml ? 0 : 1;
  run.comm->all_reduce_max(differs);
  const auto flags = differs.cpu();
  std::string ranks;
  for (int r = 0; r < run.world_size; ++r) {
    if (flags[r].item<int64_t>() != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  TORCH_CHECK(ranks.empty(), "distributed: rank(s) ", ranks,
              " started with a config that differs from rank 0's",
              root == yaml ? std::string()
                           : " (on rank " + std::to_string(run.rank) + ": " +
                                 differing_keys(yaml, root) + ")",
              "; every rank must get the same config and overrides");
}

// Rank 0's run_id (a timestamp when unset) on every rank.
std::string broadcast_run_id(Run& run) {
  const std::string& id = run.spec.settings.run_id;
  auto t = torch::zeros({64}, torch::TensorOptions().dtype(torch::kLong).device(run.device));
  if (run.rank == 0) {
    TORCH_CHECK(id.size() < 64, "config: run_id longer than 63 characters");
    auto host = torch::zeros({64}, torch::kLong);
    for (size_t i = 0; i < id.size(); ++i) host[static_cast<int64_t>(i)] = id[i];
    t.copy_(host);
  }
  run.comm->broadcast(t, 0);
  const auto host = t.cpu();
  std::string out;
  for (int64_t i = 0; i < 64 && host[i].item<int64_t>() != 0; ++i) {
    out.push_back(static_cast<char>(host[i].item<int64_t>()));
  }
  return out;
}

}  // namespace

std::unique_ptr<Run> build_run(const Config& config, const DistributedEnv& env) {
  auto run = std::make_unique<Run>();
  run->config = config;
  run->spec = resolve_run_spec(config);
  apply_numerics(numerics_settings(config));
  run->env = env;
  const TrainSettings& s = run->spec.settings;
  run->device = resolve_device(s.device, env.local_rank);
  run->precision = decide_precision(s.precision, run->device);
  // Checked before the process group exists, on every rank alike.
  const int64_t domain = s.domain_parallel;
  const int64_t world = std::max(1, env.world_size);
  TORCH_CHECK(world % domain == 0, "config: 'distributed.domain_parallel' (", domain,
              ") must divide the world size (", world, ")");
  ProcessGroupOptions pg;
  pg.timeout = std::chrono::seconds(s.distributed_timeout_s);
  run->comm = init_process_group(env, run->device, pg);
  if (run->comm) {
    run->rank = run->comm->rank();
    run->world_size = run->comm->world_size();
  }
  run->domain_size = static_cast<int>(domain);
  if (domain == run->world_size && domain > 1) {
    run->domain_group = run->comm.get();
  } else if (domain > 1) {  // data x domain: the domain groups are runs of D ranks
    std::vector<int> members;
    for (int r = 0; r < domain; ++r) members.push_back(run->data_rank() * run->domain_size + r);
    run->domain_comm = run->comm->subgroup(members);
    run->domain_group = run->domain_comm.get();
  }
  // Data first: a missing or broken dataset fails before anything is written.
  run->data = open_datasets(run->spec);
  TORCH_CHECK(run->data.train->size() >= static_cast<size_t>(run->data_world()),
              "dataset: ", run->data.train->size(), " train samples cannot feed ",
              run->data_world(), " data-parallel ranks");
  run->loader = loader_options(run->spec, run->device);
  run->loader.domain_rank = run->rank % run->domain_size;
  run->loader.domain_size = run->domain_size;
  run->shape = model_shape(run->spec, run->data.train->layout());
  run->model = build_initial_model(config, run->shape, s.seed);
  run->model->set_recompute(s.recompute);
  run->model->set_domain_group(run->domain_group);
  for (const auto& name : run->model->whole_point_inputs()) run->loader.whole_inputs.insert(name);
  config.check_known_keys();  // every key was read by something, before any work
  run->model->to(run->device);
  // training.resume=auto with run_id null: rank 0 picks the newest
  // unfinished run of this config to continue (run_checkpoints.h).
  if (run->rank == 0 && config.is_null("run_id") && s.resume_auto && !s.start_over) {
    const std::string unfinished = find_unfinished_run(s.output_dir, config, s.num_epochs);
    if (!unfinished.empty()) {
      std::cout << "Continuing run '" << unfinished << "' in " << s.output_dir
                << " (training.resume=auto: the newest unfinished run of this config; "
                   "run_id=NAME starts another)"
                << std::endl;
      run->spec.settings.run_id = unfinished;
    }
  }
  if (run->world_size > 1) {
    check_same_config_on_every_rank(*run, config.to_yaml());
    run->spec.settings.run_id = broadcast_run_id(*run);
    torch::NoGradGuard no_grad;
    for (auto& p : run->model->parameters()) {
      auto t = p.detach();
      run->comm->broadcast(t, 0);
    }
    run->averager = std::make_unique<GradientAverager>(run->model->parameters(), run->comm.get());
  }
  // The run directory's resolved_config.yaml names the run it belongs to.
  run->config = config.with_value("run_id", run->spec.settings.run_id);
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& p : run->model->named_parameters()) named.emplace_back(p.key(), p.value());
  run->optimizer = std::make_unique<MuonAdamW>(named, s.optimizer);
  LossOptions lo;
  lo.type = s.loss_type;
  lo.mask_nonfinite = s.mask_nonfinite;
  lo.fields = run->spec.fields;
  lo.metrics = s.metrics;
  lo.forces = s.force_loss;
  lo.domain_group = run->domain_group;
  run->loss = std::make_unique<LossCalculator>(lo);
  return run;
}

std::map<std::string, std::string> Run::checkpoint_metadata() const {
  std::map<std::string, std::string> meta{
      {"precision", to_string(precision)},
      {"fields", spec.fields.to_json().dump()},
      {"model", config.get<std::string>("model.name")},
      {"model_shape",
       nlohmann::json{{"input_widths", shape.input_widths}, {"out_dim", shape.out_dim}}.dump()}};
  nlohmann::json inputs = nlohmann::json::array();
  for (const auto& [name, source] : spec.inputs.inputs()) {
    inputs.push_back({{"name", name}, {"from", source.names}, {"expand_like", source.expand_like}});
  }
  meta["inputs"] = inputs.dump();
  const auto& t = spec.settings.transforms;
  meta["transforms"] =
      nlohmann::json{{"center", t.center}, {"scale_by_L_ref", t.scale_by_L_ref}}.dump();
  meta["config"] = config.to_yaml();
  if (!envelope.empty()) meta["envelope"] = envelope.to_json().dump();
  return meta;
}

nlohmann::json Run::config_record() const {
  nlohmann::json launch{{"launcher", env.launcher},
                        {"world_size", std::max(1, env.world_size)},
                        {"num_nodes", env.num_nodes},
                        {"ranks_per_node", env.local_world_size}};
  if (!env.master_addr.empty()) {
    launch["rendezvous"] = env.master_addr + ":" + std::to_string(env.master_port);
    launch["rendezvous_from"] = env.master_from;
  }
  return {
      {"model", model->class_name()}, {"num_parameters", model->parameter_count()},
      {"params", config.flat()},      {"precision", to_string(precision)},
      {"device", device.str()},       {"numerics", numerics_record(*model, device, bf16(), config)},
      {"distributed", launch}};
}

nlohmann::json Run::dataset_record() const {
  nlohmann::json targets = nlohmann::json::object();
  for (const auto& f : spec.fields.fields()) targets[f.name] = to_string(f.type);
  auto per_rank = [&](size_t n, bool drop_last) {
    return epoch_order(n, 0, 0, false, 0, data_world(), drop_last).size();
  };
  return {{"train_samples", per_rank(data.train->size(), true)},
          {"val_samples", per_rank(data.val->size(), false)},
          {"dataset_size", data.train->size() + data.val->size()},
          {"targets", targets},
          {"world_size", world_size},
          {"domain_parallel", domain_size},
          {"train", data.train->describe()},
          {"val", data.val->describe()}};
}

ModelPtr build_initial_model(const Config& config, const ModelShape& shape, uint64_t seed) {
  torch::manual_seed(seed);
  ModelPtr model = build_model(config, shape);
  if (config.has("model.init_from") && !config.is_null("model.init_from")) {
    const auto path = config.get<std::string>("model.init_from");
    TORCH_CHECK(
        is_mdlus_path(path), "config: 'model.init_from' is '", path,
        "'; expected a PhysicsNeMo .mdlus (to continue a Slipstream run, resume its run_id)");
    load_mdlus_weights(*model, read_mdlus(path));
  }
  return model;
}

TrainedModel trained_from_mdlus(const std::string& path, const Config& config,
                                const SampleLayout& layout, c10::Device device) {
  const auto file = read_mdlus(path);
  TrainedModel t;
  t.spec = resolve_run_spec(config);
  apply_numerics(numerics_settings(config));
  t.fields = t.spec.fields;
  t.trained_precision = decide_precision(t.spec.settings.precision, device);
  t.device = device;
  t.precision = inference_precision(t.trained_precision, device);
  t.model = build_model(config, model_shape(t.spec, layout));
  load_mdlus_weights(*t.model, file);
  t.checkpoint.path = path;
  t.model->to(device);
  t.model->eval();
  return t;
}

TrainedModel load_trained(const std::string& checkpoint, c10::Device device) {
  TORCH_CHECK(fs::exists(checkpoint), "checkpoint: '", checkpoint, "' does not exist");
  fs::path ckpt = fs::absolute(checkpoint);
  // A run directory stands for its checkpoints/ (the newest complete one).
  if (fs::is_directory(ckpt) && fs::is_directory(ckpt / "checkpoints")) ckpt /= "checkpoints";
  const fs::path ckpt_dir = fs::is_directory(ckpt) ? ckpt : ckpt.parent_path();
  auto info = load_newest_checkpoint(ckpt.string(), nullptr, nullptr);
  TORCH_CHECK(info.has_value(), "checkpoint: no complete checkpoint in '", checkpoint, "'");
  const auto& meta = info->metadata;
  // The checkpoint's own copy of its run's config, which no later run can
  // rewrite; the resolved_config.yaml beside it for checkpoints without one.
  const std::string config_path = (ckpt_dir.parent_path() / "resolved_config.yaml").string();
  TORCH_CHECK(meta.count("config") || fs::is_regular_file(config_path), "checkpoint: '", info->path,
              "' holds no config and there is no resolved_config.yaml "
              "beside it (looked for '",
              config_path, "')");
  const Config config = meta.count("config")
                            ? Config::parse_resolved(meta.at("config"), "'" + info->path + "'")
                            : Config::load_resolved(config_path);
  auto need = [&](const char* key) -> const std::string& {
    auto it = meta.find(key);
    TORCH_CHECK(it != meta.end(), "checkpoint: '", info->path, "' does not record '", key,
                "' (written by an older Slipstream; retrain or resume it once to rewrite it)");
    return it->second;
  };
  TrainedModel t;
  t.spec = resolve_run_spec(config);
  t.fields = FieldSchema::from_json(nlohmann::json::parse(need("fields")));
  t.trained_precision = parse_precision(need("precision"));
  t.device = device;
  t.precision = inference_precision(t.trained_precision, device);
  const auto shape_json = nlohmann::json::parse(need("model_shape"));
  ModelShape shape;
  shape.input_widths = shape_json.at("input_widths").get<std::map<std::string, int64_t>>();
  shape.out_dim = shape_json.at("out_dim").get<int64_t>();
  t.model = build_model(config, shape);
  t.checkpoint = load_checkpoint(info->path, t.model.get(), nullptr);
  if (auto it = meta.find("envelope"); it != meta.end()) {
    t.envelope = SampleEnvelope::from_json(nlohmann::json::parse(it->second));
  }
  t.model->to(device);
  t.model->eval();
  return t;
}

torch::Tensor TrainedModel::predict(const Sample& sample, int64_t chunk) const {
  TORCH_CHECK(chunk > 0, "infer: chunk must be > 0");
  LoaderOptions lo = loader_options(spec, device);
  lo.fields = fields;
  lo.sampling_resolution = 0;  // every point, transforms applied
  lo.weight_field.clear();
  lo.force_loss.reset();
  Communicator* group =
      domain_group != nullptr && domain_group->world_size() > 1 ? domain_group : nullptr;
  TORCH_CHECK(group == nullptr || model->exact_in_chunks(), "infer: ", model->class_name(),
              " cannot split a sample's points over ranks (it is not exact in chunks)");
  PointShard shard{0, sample.num_points()};
  if (group != nullptr) {  // this rank's shard of the points
    lo.domain_rank = group->rank();
    lo.domain_size = group->world_size();
    for (const auto& name : model->whole_point_inputs()) lo.whole_inputs.insert(name);
    shard = point_shard(sample.num_points(), group->rank(), group->world_size());
  }
  const Batch full = make_host_batch(sample, lo, spec.settings.seed);
  const int64_t n = sample.num_points();
  if (model->exact_in_chunks()) {  // every point at once, in bounded memory
    torch::NoGradGuard no_grad;
    ModelInputs inputs;
    std::map<const void*, torch::Tensor> on_device;  // shared inputs stay shared
    for (const auto& [name, t] : full.inputs) {
      auto& d = on_device[t.unsafeGetTensorImpl()];
      if (!d.defined()) d = t.to(device);
      inputs[name] = d;
    }
    torch::Tensor out;
    model->set_domain_group(group);
    try {
      AutocastGuard autocast(device, precision == Precision::kBf16);
      out = model->forward_in_chunks(inputs, chunk);
    } catch (...) {
      model->set_domain_group(nullptr);
      throw;
    }
    model->set_domain_group(nullptr);
    out = out.squeeze(0).to(torch::kFloat);
    if (group != nullptr) {  // every rank's shard into one (N, C), on every rank
      auto whole = torch::zeros({n, out.size(1)}, out.options());
      whole.narrow(0, shard.begin, shard.count).copy_(out);
      group->all_reduce_sum(whole);
      out = whole;
    }
    return denormalize_targets(out.cpu(), sample, fields);
  }
  auto gen = at::detail::createCPUGenerator(spec.settings.seed + 17);
  const auto order = torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kLong));
  auto prediction = torch::empty({n, fields.total_channels()}, torch::kFloat);
  torch::NoGradGuard no_grad;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const auto idx = order.narrow(0, begin, std::min(chunk, n - begin));
    ModelInputs inputs;
    std::map<const void*, torch::Tensor> chunked;  // shared inputs stay shared
    for (const auto& [name, t] : full.inputs) {
      auto& c = chunked[t.unsafeGetTensorImpl()];
      // Per-point inputs are chunked; a global input (1, 1, C) goes whole.
      if (!c.defined()) c = (t.size(1) == n ? t.index_select(1, idx) : t).to(device);
      inputs[name] = c;
    }
    torch::Tensor out;
    {
      AutocastGuard autocast(device, precision == Precision::kBf16);
      out = model->forward(inputs);
    }
    prediction.index_copy_(0, idx, out.squeeze(0).to(torch::kFloat).cpu());
  }
  return denormalize_targets(prediction, sample, fields);
}

}  // namespace slipstream::aero
