#include "aero/data/dataset_source.h"

#include "aero/data/dataset_formats.h"
#include "aero/data/manifest.h"
#include "aero/data/sample_file.h"

#include <c10/util/Exception.h>

#include <filesystem>

namespace slipstream::aero {

namespace fs = std::filesystem;

namespace {

bool has_manifest(const DatasetSource& source) { return fs::exists(source.manifest_path()); }

// The entries of one split: its own list manifest (style A) when given,
// else the named split of the manifest. `missing_ok`: a dict manifest
// without that split gives no entries.
std::vector<std::string> split_entries(const DatasetSource& source, const std::string& split,
                                       const std::string& own_manifest, bool missing_ok,
                                       std::string& manifest_path) {
  if (!own_manifest.empty()) {
    manifest_path = own_manifest;
    return read_manifest(own_manifest).split(split);
  }
  manifest_path = source.manifest_path();
  TORCH_CHECK(fs::exists(manifest_path), "dataset: manifest '", manifest_path,
              "' is missing; write the directory with `slipstream prepare` or `slipstream "
              "make-synthetic`, or name one with dataset.manifest (or dataset.train_manifest and "
              "dataset.val_manifest)");
  const Manifest m = read_manifest(manifest_path);
  if (missing_ok && m.named_splits && !m.splits.count(split)) return {};
  return m.split(split);
}

std::shared_ptr<Dataset> open_entries(const DatasetSource& source,
                                      const std::vector<std::string>& entries,
                                      const std::string& manifest_path, const std::string& split) {
  return dataset_format(resolved_format(source)).open(source, entries, manifest_path, split);
}

}  // namespace

std::string resolved_format(const DatasetSource& source) {
  TORCH_CHECK(fs::is_directory(source.path), "dataset: directory '", source.path,
              "' does not exist");
  if (source.format != "auto") (void)dataset_format(source.format);  // a known one
  const std::string written =
      has_manifest(source) ? read_manifest(source.manifest_path()).format : "";
  TORCH_CHECK(written.empty() || is_sample_format(written), "dataset: manifest '",
              source.manifest_path(), "' has format '", written, "', expected '", kSampleFormat,
              "' (or none)");
  if (source.format != "auto") return source.format;
  for (const auto& f : dataset_formats()) {
    if (f.found_in(source)) return f.name;
  }
  return dataset_formats().front().name;  // sample files without a manifest's word
}

DatasetSplits open_dataset(const DatasetSource& source, const std::string& train_split,
                           const std::string& val_split) {
  (void)resolved_format(source);  // a missing directory or a foreign manifest first
  std::string manifest_path;
  const auto train =
      split_entries(source, train_split, source.train_manifest, false, manifest_path);
  TORCH_CHECK(!train.empty(), "dataset: manifest '", manifest_path, "' lists no samples in split '",
              train_split, "'");
  DatasetSplits out;
  out.train = open_entries(source, train, manifest_path, train_split);
  std::vector<std::string> val;
  std::string val_manifest_path = manifest_path;
  if (!val_split.empty() || !source.val_manifest.empty()) {
    // A dataset without a val split validates on nothing under the default
    // name; any other name must be there (a typo must not turn validation off).
    try {
      val = split_entries(source, val_split, source.val_manifest, val_split == "val",
                          val_manifest_path);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "val_split: ", e.what_without_backtrace(),
                  "; val_split=null validates on nothing");
    }
  }
  out.val = open_entries(source, val, val_manifest_path, val_split);
  return out;
}

std::vector<std::string> split_names(const DatasetSource& source) {
  TORCH_CHECK(fs::exists(source.manifest_path()), "dataset: manifest '", source.manifest_path(),
              "' is missing");
  return read_manifest(source.manifest_path()).split_names();
}

std::shared_ptr<Dataset> open_split(const DatasetSource& source, const std::string& split) {
  (void)resolved_format(source);
  std::string manifest_path;
  const auto entries = split_entries(source, split, "", false, manifest_path);
  return open_entries(source, entries, manifest_path, split);
}

DatasetSplits open_sample_directory(const std::string& dir) {
  DatasetSource source;
  source.path = dir;
  return open_dataset(source, "train", "val");
}

std::vector<std::string> split_names(const std::string& dir) {
  DatasetSource source;
  source.path = dir;
  return split_names(source);
}

std::shared_ptr<Dataset> open_split(const std::string& dir, const std::string& split) {
  DatasetSource source;
  source.path = dir;
  return open_split(source, split);
}

}  // namespace slipstream::aero
