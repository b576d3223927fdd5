// A run, assembled once from its config: the one place that decides the
// device, the precision, the ranks and their communicator, the data splits,
// the target fields and model inputs, the model, the optimizer, the loss and
// the gradient averager. The trainer, `slipstream bench` and `slipstream
// info` all start from build_run() (or its first steps); inference
// (infer/trained_model.h) from the same RunSpec and runtime (run/), so that
// they cannot disagree about any of it.
#pragma once

#include "aero/config/config.h"
#include "aero/data/dataset.h"
#include "aero/data/loader.h"
#include "aero/data/sample_envelope.h"
#include "aero/loss/loss_calculator.h"
#include "aero/model/model.h"
#include "aero/model/registry.h"
#include "aero/optim/muon_adamw.h"
#include "aero/run/checkpoint.h"
#include "aero/run/run_spec.h"
#include "aero/run/train_settings.h"
#include "core/distributed/communicator.h"
#include "core/distributed/gradient_averager.h"
#include "core/distributed/launch_env.h"

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>

namespace slipstream::aero {

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
  // bf16 autocast: under bf16, and under fp8 (its Linears' GEMMs in fp8).
  bool bf16() const { return bf16_autocast(precision); }
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

}  // namespace slipstream::aero
