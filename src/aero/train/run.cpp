#include "aero/train/run.h"

#include "aero/interop/mdlus.h"
#include "aero/ops/domain_parallel.h"
#include "aero/ops/numerics_settings.h"
#include "aero/run/runtime.h"
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
  const NumericsSettings numerics = numerics_settings(config);  // checked before anything starts
  run->env = env;
  const TrainSettings& s = run->spec.settings;
  // Checked before the process group exists, on every rank alike.
  const int64_t domain = s.domain_parallel;
  const int64_t world = std::max(1, env.world_size);
  TORCH_CHECK(world % domain == 0, "config: 'distributed.domain_parallel' (", domain,
              ") must divide the world size (", world, ")");
  Runtime rt = open_runtime(s.device, env, s.distributed_timeout_s);
  run->device = rt.device;
  run->comm = std::move(rt.comm);
  run->rank = rt.rank;
  run->world_size = rt.world_size;
  run->precision = decide_precision(s.precision, run->device);
  apply_numerics(numerics, run->precision == Precision::kFp8);
  run->domain_size = static_cast<int>(domain);
  if (domain == run->world_size && domain > 1) {
    run->domain_group = run->comm.get();
  } else if (domain > 1) {  // data x domain: the domain groups are runs of D ranks
    std::vector<int> members;
    members.reserve(static_cast<size_t>(domain));
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

}  // namespace slipstream::aero
