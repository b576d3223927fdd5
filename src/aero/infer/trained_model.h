// A trained model ready for inference, loaded from a Slipstream checkpoint
// or a PhysicsNeMo .mdlus, and its prediction of a whole sample at full
// resolution.
#pragma once

#include "aero/config/config.h"
#include "aero/data/sample.h"
#include "aero/data/sample_envelope.h"
#include "aero/fields/field_schema.h"
#include "aero/model/model.h"
#include "aero/run/checkpoint.h"
#include "aero/run/run_spec.h"
#include "core/distributed/communicator.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace slipstream::aero {

// A trained model ready for inference, with what it was trained with.
struct TrainedModel {
  ModelPtr model;
  RunSpec spec;
  FieldSchema fields;  // from the checkpoint: the statistics it trained with
  Precision trained_precision = Precision::kFp32;
  Precision precision = Precision::kFp32;       // what predict() runs in
  SampleDomain domain = SampleDomain::kVolume;  // what its samples are (dataset.kind)
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

// A checkpoint read for inference, once: the file (checked) and the config
// it was trained with (its own copy, or the run's resolved_config.yaml
// beside it for a checkpoint without one). `checkpoint` is a file, a
// checkpoints/ directory or a run directory (its newest complete
// checkpoint).
struct TrainedCheckpoint {
  CheckpointFile file;
  Config config;
};
TrainedCheckpoint read_trained(const std::string& checkpoint);

// The model of a read checkpoint on `device`, the config's numerics
// applied (model/numerics_settings.h).
TrainedModel load_trained(const TrainedCheckpoint& trained, c10::Device device);
// read_trained, then load_trained.
TrainedModel load_trained(const std::string& checkpoint, c10::Device device);

// A PhysicsNeMo .mdlus ready for inference on samples of `layout`: the
// config (model.* keys, the dataset's targets and statistics, precision)
// supplies what the file does not record, and must build the file's model
// (else the error lists the differences).
TrainedModel trained_from_mdlus(const std::string& path, const Config& config,
                                const SampleLayout& layout, c10::Device device);

}  // namespace slipstream::aero
