// Opening a dataset by its source: Slipstream's sample directories or
// PhysicsNeMo-Curator's .pdmsh trees, split by a manifest in any of the
// recipe's styles (manifest.h).
#pragma once

#include "aero/data/dataset.h"
#include "aero/data/pdmsh_dataset.h"

#include <memory>
#include <string>
#include <vector>

namespace slipstream::aero {

// Where a dataset's samples are and how a manifest splits them (the
// recipe's data block). Formats: "samples" (Slipstream's safetensors, one
// file per sample, written by prepare or make-synthetic), "pdmsh"
// (PhysicsNeMo-Curator's trees, pdmsh_dataset.h), "auto" (samples when the
// manifest says so or no .pdmsh matches the pattern, else pdmsh).
struct DatasetSource {
  std::string path;
  std::string format = "auto";
  std::string manifest;  // empty: <path>/manifest.json
  // The recipe's style A: one list or text manifest per split; each, when
  // set, replaces the named split of `manifest`.
  std::string train_manifest, val_manifest;
  PdmshOptions pdmsh;
  std::string manifest_path() const {
    return manifest.empty() ? path + "/manifest.json" : manifest;
  }
};

// "samples" or "pdmsh"; throws naming the directory when it is missing.
std::string resolved_format(const DatasetSource& source);

// The train and val splits by name (an empty val_split: no val). Training
// needs a non-empty train split; a dict manifest without the val split
// gives an empty val. Every entry must name a sample: a file ("a" is found
// as a or a.safetensors) or a run directory (run_1 names run_1/x.pdmsh).
// Throws naming the manifest, the split and the entry.
DatasetSplits open_dataset(const DatasetSource& source, const std::string& train_split,
                           const std::string& val_split);
// The splits a dict manifest names (empty for a list or text one), and one
// of them (an error lists the others).
std::vector<std::string> split_names(const DatasetSource& source);
std::shared_ptr<Dataset> open_split(const DatasetSource& source, const std::string& split);

// A directory of Slipstream samples with its manifest.json: train and val.
DatasetSplits open_sample_directory(const std::string& dir);
std::vector<std::string> split_names(const std::string& dir);
std::shared_ptr<Dataset> open_split(const std::string& dir, const std::string& split);

}  // namespace slipstream::aero
