// `slipstream infer`: a trained model over every point of a raw run, written
// back as a .vtu for ParaView with, per target field, <name>_pred,
// <name>_true and <name>_error (pred - true), in physical units (the
// dataset's transforms undone), plus <out>.json with the metrics.
//
// The checkpoint is a file or a checkpoints/ directory (its newest complete
// checkpoint); the model's config is the run's resolved_config.yaml beside
// it. Points go through the model in chunks of the training resolution, in a
// fixed random order, so each chunk sees the whole body as training did.
#pragma once

#include <map>
#include <string>

namespace slipstream::aero {

struct InferOptions {
  std::string checkpoint;
  std::string run_dir;
  std::string out;
  std::map<std::string, std::string> fields;  // target -> .vtu field name
  std::string device = "auto";
};

struct InferReport {
  int64_t points = 0;
  std::map<std::string, double> metrics;
  std::string metrics_path;
};

InferReport run_inference(const InferOptions& options);

}  // namespace slipstream::aero
