// What a config describes before any process group, model or optimizer
// exists: the settings, the target fields, the model's inputs, the
// precision on a device, and the data those name. Training (train/run.h)
// and inference (infer/trained_model.h) both start from it.
#pragma once

#include "aero/config/config.h"
#include "aero/data/dataset.h"
#include "aero/data/input_spec.h"
#include "aero/data/loader.h"
#include "aero/fields/field_schema.h"
#include "aero/model/model.h"
#include "aero/run/train_settings.h"

#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

namespace slipstream::aero {

// fp8: bf16 autocast with the Linears' GEMMs in fp8 (ops/fp8_linear.h).
enum class Precision { kFp32, kBf16, kFp8 };
std::string to_string(Precision precision);  // "fp32" | "bf16" | "fp8"
Precision parse_precision(const std::string& name);
// Whether `p` runs under bf16 autocast (bf16 and fp8 do).
inline bool bf16_autocast(Precision p) { return p != Precision::kFp32; }
// The `precision` setting on `device`: "auto" is bf16 autocast on CUDA and
// fp32 elsewhere; "fp32" is fp32 everywhere; "bf16" needs CUDA; "fp8" a GPU
// with fp8 tensor cores and a build that has the fp8 GEMMs (else it fails
// saying why).
Precision decide_precision(const std::string& setting, c10::Device device);
// What inference of a model trained in `trained` runs in on `device`: the
// same precision, except fp32 on a CPU (bf16 autocast is CUDA-only here)
// and bf16 for fp8 on a GPU without the fp8 GEMMs.
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

// What a run's samples are: volume points or surface cells (with normals
// and areas, and forces), decided once from dataset.kind.
enum class SampleDomain { kVolume, kSurface };
SampleDomain sample_domain(const TrainSettings& settings);
// "points" or "cells", for messages.
const char* point_noun(SampleDomain domain);

}  // namespace slipstream::aero
