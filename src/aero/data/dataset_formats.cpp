#include "aero/data/dataset_formats.h"

#include "aero/data/dataset_source.h"
#include "aero/data/manifest.h"
#include "aero/data/pdmsh_dataset.h"
#include "aero/data/sample_file.h"
#include "core/text/join.h"

#include <c10/util/Exception.h>

#include <filesystem>

namespace slipstream::aero {

namespace fs = std::filesystem;

namespace {

// Slipstream sample files for the entries: "a" is the file a or
// a.safetensors under the root.
std::vector<std::string> sample_files(const DatasetSource& source,
                                      const std::vector<std::string>& entries,
                                      const std::string& manifest_path, const std::string& split) {
  std::vector<std::string> files;
  for (const auto& name : entries) {
    if (fs::is_regular_file(source.path + "/" + name)) {
      files.push_back(name);
    } else if (fs::is_regular_file(source.path + "/" + name + ".safetensors")) {
      files.push_back(name + ".safetensors");
    } else {
      TORCH_CHECK(false, "dataset: manifest '", manifest_path, "' lists '", name, "' in split '",
                  split, "', which does not exist under '", source.path, "'");
    }
  }
  return files;
}

std::shared_ptr<Dataset> open_sample_files(const DatasetSource& source,
                                           const std::vector<std::string>& entries,
                                           const std::string& manifest_path,
                                           const std::string& split) {
  auto files = sample_files(source, entries, manifest_path, split);
  // Each file is the one its manifest recorded (headers only).
  if (!manifest_path.empty() && fs::is_regular_file(manifest_path)) {
    check_checksums(read_manifest(manifest_path), source.path, files);
  }
  return std::make_shared<DirectoryDataset>(source.path, std::move(files));
}

std::shared_ptr<Dataset> open_pdmsh(const DatasetSource& source,
                                    const std::vector<std::string>& entries,
                                    const std::string& manifest_path, const std::string& split) {
  const auto found = glob_relative(source.path, source.pdmsh.pattern);
  std::vector<std::string> samples;
  for (size_t i : match_entries(entries, found, manifest_path, split)) samples.push_back(found[i]);
  return std::make_shared<PdmshDataset>(source.path, samples, source.pdmsh);
}

}  // namespace

const std::vector<DatasetFormat>& dataset_formats() {
  static const std::vector<DatasetFormat> all = {
      {"samples", "Slipstream sample files (slipstream prepare, make-synthetic)",
       // Written by Slipstream: its manifest says so (a directory that
       // holds nothing else is taken for one, below).
       [](const DatasetSource& s) {
         return fs::exists(s.manifest_path()) &&
                is_sample_format(read_manifest(s.manifest_path()).format);
       },
       open_sample_files},
      {"pdmsh", "PhysicsNeMo-Curator's .pdmsh tree",
       [](const DatasetSource& s) { return !glob_relative(s.path, s.pdmsh.pattern).empty(); },
       open_pdmsh},
  };
  return all;
}

std::vector<std::string> dataset_format_choices() {
  std::vector<std::string> out{"auto"};
  for (const auto& f : dataset_formats()) out.emplace_back(f.name);
  return out;
}

const DatasetFormat& dataset_format(const std::string& name) {
  for (const auto& f : dataset_formats()) {
    if (name == f.name) return f;
  }
  TORCH_CHECK(false, "dataset: format '", name, "' is not one of ", join(dataset_format_choices()));
}

}  // namespace slipstream::aero
