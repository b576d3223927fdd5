// A run, assembled once from its config: the one place that decides the
// device, the precision, the ranks and their communicator, the data splits,
// the target fields and model inputs, the model, the optimizer, the loss and
// the gradient averager. The trainer, `slipstream bench` and `slipstream
// info` all start from build_run() (or its first steps), and inference from
// load_trained(), so that they cannot disagree about any of it.
#pragma once

#include "aero/config/config.h"
#include "aero/data/dataset.h"
#include "aero/data/input_spec.h"
#include "aero/data/loader.h"
#include "aero/data/sample_envelope.h"
#include "aero/fields/field_schema.h"
#include "aero/loss/loss_calculator.h"
#include "aero/model/model.h"
#include "aero/model/registry.h"
#include "aero/optim/muon_adamw.h"
#include "aero/train/checkpoint.h"
#include "aero/train/train_settings.h"
#include "core/distributed/communicator.h"
#include "core/distributed/gradient_averager.h"
#include "core/distributed/process_group.h"

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>

namespace slipstream::aero {

enum class Precision { kFp32, kBf16 };
std::string to_string(Precision precision);  // "fp32" | "bf16"
Precision parse_precision(const std::string& name);
// The `precision` setting on `device`: "auto" is bf16 autocast on CUDA and
// fp32 elsewhere; "fp32" is fp32 everywhere; "bf16" needs CUDA.
Precision decide_precision(const std::string& setting, c10::Device device);
// What inference of a model trained in `trained` runs in on `device`: the
// same precision, except fp32 on a CPU (bf16 autocast is CUDA-only here).
Precision inference_precision(Precision trained, c10::Device device);

// What a config describes before any data, process group or model exists.
// One of the recipe's extra_datasets: its own source, the same targets.
struct ExtraDataset {
  std::string name;  // its dataset config (configs/dataset/<name>.yaml)
  TrainSettings settings;
  FieldSchema fields;
};

struct RunSpec {
  TrainSettings settings;
  FieldSchema fields;
  InputSpec inputs;
  std::string model_config;  // the model file picked (defaults.model)
  // Trained on together with the dataset (their train and val splits
  // appended to its); each must declare the same targets, field transforms
  // and sample transforms, else open_datasets names the difference.
  std::vector<ExtraDataset> extra_datasets;
};
RunSpec resolve_run_spec(const Config& config);
// The splits the config names (synthetic in memory, or a sample directory),
// each checking its samples against what the spec needs of them.
DatasetSplits open_datasets(const RunSpec& spec);
// One named split of the run's data for inference (unchecked): `dir`, or
// the config's dataset.path when `dir` is empty; a synthetic dataset in
// memory has train and val. An unknown split is an error listing the known.
std::shared_ptr<Dataset> open_named_split(const RunSpec& spec, const std::string& split,
                                          const std::string& dir);
// The model's input and output widths for samples of `layout`; throws when
// the samples lack a tensor the inputs or targets need.
ModelShape model_shape(const RunSpec& spec, const SampleLayout& layout);
// The loader's options for the spec on `device` (no augmentation).
LoaderOptions loader_options(const RunSpec& spec, c10::Device device);

struct Run {
  Config config;
  RunSpec spec;
  DistributedEnv env;
  std::unique_ptr<Communicator> comm;  // null for a world of one
  int rank = 0, world_size = 1;
  // distributed.domain_parallel: each sample's points are sharded over
  // domain_size ranks (rank % domain_size is the shard), whose communicator
  // the model and the loss sum over; the samples are dealt to the
  // world_size / domain_size data ranks (rank / domain_size).
  int domain_size = 1;
  Communicator* domain_group = nullptr;       // comm, or domain_comm, when domain_size > 1
  std::unique_ptr<Communicator> domain_comm;  // this rank's domain group when 1 < D < world
  int data_rank() const { return rank / domain_size; }
  int data_world() const { return world_size / domain_size; }
  c10::Device device{c10::kCPU};
  Precision precision = Precision::kFp32;
  DatasetSplits data;
  LoaderOptions loader;
  ModelShape shape;
  ModelPtr model;
  std::unique_ptr<MuonAdamW> optimizer;
  std::unique_ptr<LossCalculator> loss;
  std::unique_ptr<GradientAverager> averager;  // null for a world of one
  // The train split's envelope (sample_envelope.h), recorded in every
  // checkpoint; filled by the trainer (empty in bench and info).
  SampleEnvelope envelope;

  const TrainSettings& settings() const { return spec.settings; }
  bool bf16() const { return precision == Precision::kBf16; }
  // What a checkpoint records so that load_trained() needs nothing else.
  std::map<std::string, std::string> checkpoint_metadata() const;
  // The logs' "config" and "dataset" records, in the recipe's layout: model,
  // num_parameters, params (the flattened config), plus precision, device
  // and numerics; train_samples and val_samples (per rank, as the recipe's
  // samplers count), dataset_size, targets, plus world_size and the splits.
  nlohmann::json config_record() const;
  nlohmann::json dataset_record() const;
};

// Joins the process group that `env` describes (none for a world of one),
// opens the data and builds everything above. Every rank must be given the
// same config (checked: a rank that differs is named), and gets rank 0's
// run_id.
std::unique_ptr<Run> build_run(const Config& config, const DistributedEnv& env);

// The model a run starts from: built from the config (seeded), then, when
// `model.init_from` names a PhysicsNeMo .mdlus, given its weights (the
// config must build the same model: else an error listing the
// differences). A resumed run's checkpoint still wins over both.
ModelPtr build_initial_model(const Config& config, const ModelShape& shape, uint64_t seed);

// A trained model ready for inference, with what it was trained with.
struct TrainedModel {
  ModelPtr model;
  RunSpec spec;
  FieldSchema fields;  // from the checkpoint: the statistics it trained with
  Precision trained_precision = Precision::kFp32;
  Precision precision = Precision::kFp32;  // what predict() runs in
  c10::Device device{c10::kCPU};
  CheckpointInfo checkpoint;
  // What it was trained on (empty for a .mdlus or an older checkpoint).
  SampleEnvelope envelope;
  // Inference over domain-parallel ranks: each rank of this group runs its
  // shard of every sample's points (point_shard, the model's
  // whole_point_inputs whole) and every rank gets the whole prediction.
  // Every rank must predict the same samples in the same order. Null: one
  // process.
  Communicator* domain_group = nullptr;

  // Every point of `sample` through the model (the dataset's transforms,
  // no augmentation); (N, C) in physical units, in the fields' channel
  // order. A model exact in chunks (Transolver, GeoTransolver) sees every
  // point at once, `chunk` points at a time (two passes a layer: the result
  // does not depend on `chunk`); another would run on chunks of `chunk`
  // points drawn in a fixed random order, each spanning the whole body: an
  // approximation wherever chunk < N (and it cannot run over ranks).
  torch::Tensor predict(const Sample& sample, int64_t chunk) const;
};

// `checkpoint` is a file, a checkpoints/ directory or a run directory (its
// newest complete checkpoint); the config is the run's resolved_config.yaml
// beside it.
TrainedModel load_trained(const std::string& checkpoint, c10::Device device);

// A PhysicsNeMo .mdlus ready for inference on samples of `layout`: the
// config (model.* keys, the dataset's targets and statistics, precision)
// supplies what the file does not record, and must build the file's model
// (else the error lists the differences).
TrainedModel trained_from_mdlus(const std::string& path, const Config& config,
                                const SampleLayout& layout, c10::Device device);

}  // namespace slipstream::aero
