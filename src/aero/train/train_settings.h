// TrainSettings: every option the trainer uses, resolved from a Config in
// one place (and validated there, so bad values fail before any work).
#pragma once

#include "aero/config/config.h"
#include "aero/data/dataset.h"
#include "aero/data/transforms.h"
#include "aero/loss/loss_calculator.h"
#include "aero/model/transolver.h"
#include "aero/optim/muon_adamw.h"
#include "core/readback/step_readback.h"

#include <string>

namespace slipstream::aero {

struct TrainSettings {
  std::string run_id;
  std::string output_dir = "runs";
  uint64_t seed = 0;
  std::string device = "auto";
  std::string precision = "auto";
  int64_t num_epochs = 1;
  int64_t save_interval = 1;
  bool resume = true;
  bool validate = true;
  int64_t steps_per_epoch = 0;  // 0: one pass over the train shard
  ReadbackPolicy readback = ReadbackPolicy::kAsync;
  OptimizerOptions optimizer;
  std::string scheduler = "steplr";
  int64_t scheduler_step_size = 1;
  double scheduler_gamma = 1.0;
  bool scheduler_per_step = false;
  LossOptions loss;
  bool volume_weights = false;
  int console_every_n_steps = 1;
  bool tensorboard = true;
  int64_t distributed_timeout_s = 180;

  TransolverOptions model;
  // Dataset.
  std::string dataset_path;  // empty: synthetic in memory
  int64_t num_train = 0, num_val = 0;
  SyntheticOptions synthetic;
  int64_t sampling_resolution = 0;
  bool shuffle = true;
  std::vector<std::string> targets;
  TransformOptions transforms;

  std::string run_dir() const { return output_dir + "/" + run_id; }
};

TrainSettings resolve_settings(const Config& config);
// The loader's options for these settings (no augmentation).
struct LoaderOptions;
LoaderOptions loader_options_for(const TrainSettings& s, c10::Device device);
TransolverOptions resolve_model_options(const Config& config);
std::vector<TargetField> target_fields(const std::vector<std::string>& names);
// The learning rate after `t` scheduler intervals.
double scheduled_lr(const TrainSettings& s, int64_t t);

}  // namespace slipstream::aero
