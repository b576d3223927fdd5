// Split manifests, in the recipe's three styles (its `load_manifest`):
//   JSON dict  {"train": [...], "val": [...], "test": [...]}: a split is
//              chosen by name (Slipstream's own manifest is this, with
//              "format", "source" and "checksums" keys besides the splits);
//   JSON list  ["run_1", "run_2", ...]: one split, whatever it is called;
//   text       one entry per line; blank lines and # comments are skipped.
// Entries name samples: a file (Slipstream's samples) or a run directory
// (run_1 names run_1/domain_1.pdmsh). Every error names the manifest file.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace slipstream::aero {

struct Manifest {
  std::string path;
  bool named_splits = false;  // a JSON dict; else a list or a text file
  std::map<std::string, std::vector<std::string>> splits;  // named_splits
  std::vector<std::string> entries;                        // a list or text
  std::string format;                                      // a dict's "format" key, if any
  // A dict's "checksums": each sample file's SampleFile::fingerprint, as
  // prepare and make-synthetic wrote it (empty for older manifests).
  std::map<std::string, uint32_t> checksums;

  // The split's entries: a dict's named split (an error lists the splits it
  // has), or every entry of a list or text manifest.
  const std::vector<std::string>& split(const std::string& name) const;
  std::vector<std::string> split_names() const;  // a dict's; empty otherwise
};

// Throws naming `path` when it is missing, or JSON that is neither a dict of
// lists of strings nor a list of strings.
Manifest read_manifest(const std::string& path);

// Adds `dir`/`name`'s fingerprint (SampleFile::fingerprint) to a manifest
// being written, under "checksums".
void record_checksum(nlohmann::json& manifest, const std::string& dir, const std::string& name);

// Throws, naming the file and the manifest, unless every one of `files`
// (relative to `dir`) is the file the manifest recorded; a manifest without
// checksums (an older one) checks nothing. Reads headers only.
void check_checksums(const Manifest& manifest, const std::string& dir,
                     const std::vector<std::string>& files);

// Which of `samples` (paths relative to the dataset root) each entry names:
// the sample itself, or a sample under a directory of that name (any parent
// component of its path). An entry naming nothing is an error naming the
// manifest, the split and the entry. Returns indices into `samples`, in the
// entries' order, each sample at most once.
std::vector<size_t> match_entries(const std::vector<std::string>& entries,
                                  const std::vector<std::string>& samples,
                                  const std::string& manifest_path, const std::string& split);

}  // namespace slipstream::aero
