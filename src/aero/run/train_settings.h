// TrainSettings: the run's schedule, logging, paths and dataset options,
// resolved from a Config in one place and validated there, so that bad
// values fail before any work. The model's options are resolved by its
// family (model/registry.h), the target fields by resolve_fields().
#pragma once

#include "aero/config/config.h"
#include "aero/data/dataset_source.h"
#include "aero/data/synthetic.h"
#include "aero/data/transforms.h"
#include "aero/fields/field_schema.h"
#include "aero/forces/force_coefficients.h"
#include "aero/forces/force_loss.h"
#include "aero/ops/recompute.h"
#include "aero/optim/muon_adamw.h"
#include "core/readback/step_readback.h"

#include <optional>
#include <string>
#include <vector>

namespace slipstream::aero {

// The `force_coefficients:` section: what surface inference integrates the
// forces with. A reference area or length left null comes from each
// sample's A_ref / L_ref global. The shear field's meaning is the dataset's
// (dataset.shear_stress); a config without it (a checkpoint written before
// the key existed) has none, and integrating forces then fails naming the key.
struct ForceSettings {
  bool enabled = true;
  std::optional<ShearConvention> shear;
  std::optional<double> reference_area, reference_length;
  Vec3 moment_center{0.0, 0.0, 0.0};
  Vec3 up_direction{0.0, 0.0, 1.0};
  // The options for one sample; throws naming the sample when a reference
  // value is neither configured nor among its globals.
  ForceOptions for_sample(const std::string& sample_id, double sample_a_ref,
                          double sample_l_ref) const;
};

// training.cuda_graph: "auto" (on for single-process CUDA training, else
// off), "true" (on; an error where it cannot be), "false" (graphed_step.h).
enum class CudaGraphMode { kAuto, kOn, kOff };
CudaGraphMode parse_cuda_graph_mode(const std::string& value);

struct TrainSettings {
  std::string run_id;
  std::string output_dir = "runs";
  uint64_t seed = 0;
  std::string device = "auto";
  std::string precision = "auto";
  int64_t num_epochs = 1;
  int64_t save_interval = 1;
  int64_t keep_last = 3;  // checkpoints kept (>= 2); older ones are pruned
  // training.keep_best: checkpoints/best.safetensors holds the checkpoint of
  // the lowest val loss so far, whatever keep_last prunes.
  bool keep_best = true;
  // training.resume: true continues run_id's newest good checkpoint; auto
  // (resume_auto) also does, and with run_id null continues the newest
  // unfinished run of the same config (find_unfinished_run); false refuses a
  // run_id that has checkpoints.
  bool resume = true;
  bool resume_auto = false;
  bool start_over = false;  // discard this run_id's checkpoints and logs
  bool validate = true;
  // training.memory_check: refuse, before the first step, a config whose
  // estimated memory (model/memory_estimate.h) exceeds the device's.
  bool memory_check = true;
  int64_t steps_per_epoch = 0;  // 0: one pass over the train shard
  RecomputeOptions recompute;   // training.recompute, training.recompute_chunk
  ReadbackPolicy readback = ReadbackPolicy::kAsync;
  CudaGraphMode cuda_graph = CudaGraphMode::kAuto;
  OptimizerOptions optimizer;
  std::string scheduler = "steplr";
  int64_t scheduler_step_size = 1;
  double scheduler_gamma = 1.0;
  bool scheduler_per_step = false;
  std::string loss_type = "huber";
  bool mask_nonfinite = false;
  std::vector<std::string> metrics{"l1", "l2", "mae"};
  std::string weight_field;     // "volume" or "area": weight the loss; empty: none
  ForceLossOptions force_loss;  // loss.forces (absent in older configs: off)
  int console_every_n_steps = 1;
  bool tensorboard = true;
  int64_t distributed_timeout_s = 180;
  // Ranks that share each sample, its points sharded over them
  // (domain_parallel.h); 1: data parallelism alone.
  int64_t domain_parallel = 1;

  // Dataset: its source (an empty path: synthetic in memory) and the
  // manifest's splits the run trains and validates on (the recipe's
  // top-level train_split / val_split; an empty val_split: none).
  DatasetSource data;
  std::string train_split = "train", val_split = "val";
  bool synthetic_data() const { return data.path.empty(); }
  std::string dataset_kind = "volume";  // volume | surface (the samples' kind)
  int64_t num_train = 0, num_val = 0;
  SyntheticOptions synthetic;
  int64_t sampling_resolution = 0;
  int num_workers = 0;  // loader threads; 0: auto (resolved_workers, loader.h)
  bool shuffle = true;
  TransformOptions transforms;
  ForceSettings forces;

  std::string run_dir() const { return output_dir + "/" + run_id; }
};

TrainSettings resolve_settings(const Config& config);
// The dataset's source: dataset.path, .format, .manifest, .train_manifest,
// .val_manifest and .pdmsh (each optional).
DatasetSource resolve_dataset_source(const Config& config);
// dataset.kind: "volume" (also when absent: older configs) or "surface".
std::string resolve_dataset_kind(const Config& config);

// The target fields from the dataset's `targets`, `nondim` and
// `normalization` maps and the loss's `field_weights`; a name in those maps
// that is not a target is an error naming the key.
FieldSchema resolve_fields(const Config& config);

// The learning rate after `t` scheduler intervals.
double scheduled_lr(const TrainSettings& s, int64_t t);

}  // namespace slipstream::aero
