// Config: the recipe's YAML tree, laid out like its Hydra configs.
//
// configs/train.yaml holds the run (schedule, precision, logging) and a
// `defaults` map naming the group files to merge: `model: transolver_small`
// loads configs/model/transolver_small.yaml under the key `model`, and so on
// for `dataset`. Overrides `key.sub=value` then apply, in order:
//   - `model=NAME` (a group name alone) picks configs/model/NAME.yaml;
//   - any other key must already exist in the tree (an unknown key is an
//     error naming it and the closest valid key), and its value must parse
//     as the existing value's type (int, float, bool, string; null takes
//     any scalar).
// All checks happen before any work starts.
#pragma once

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include <initializer_list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace slipstream::aero {

// Throws unless `value` (the config's `key`) is one of `allowed`, naming the
// key, the value and the choices.
void check_one_of(const std::string& key, const std::string& value,
                  std::initializer_list<const char*> allowed);
void check_one_of(const std::string& key, const std::string& value,
                  const std::vector<std::string>& allowed);
// Throws unless `v` (the config's `key`) is > 0, naming the key and value.
void check_positive(const std::string& key, double v);

class Config {
 public:
  // Loads `dir`/train.yaml, merges the default groups, applies overrides.
  static Config load(const std::string& dir, const std::vector<std::string>& overrides);

  // A resolved config as written to a run directory (no merging).
  static Config load_resolved(const std::string& path);
  // The same from its text (a checkpoint's own copy); `origin` names it in errors.
  static Config parse_resolved(const std::string& yaml, const std::string& origin);

  // Typed access by dotted key; throws naming the key when it is missing or
  // of the wrong type. Every access marks the key as known (see
  // check_known_keys).
  template <class T>
  T get(const std::string& key) const;
  bool is_null(const std::string& key) const;
  bool has(const std::string& key) const;
  // A whole section (a map the code reads as a unit, such as dataset.targets)
  // as a copy, or an undefined node when absent; marks it known.
  YAML::Node section(const std::string& key) const;

  // Throws, before any work, if a key of the tree was never read by the code
  // that resolved it (a misspelt key inside a YAML file: overrides are
  // checked when applied), naming the key, the file it came from and the
  // closest known key. Call once everything is resolved.
  void check_known_keys() const;

  // The recipe's extra_datasets, each as a config whose `dataset` section is
  // that dataset (the rest as this one): the name of its file and the config.
  // An entry is a dataset config's name or {config: NAME, key: value, ...};
  // load() resolves it, checking each key exists in that file.
  std::vector<std::pair<std::string, Config>> extra_dataset_configs() const;

  // The resolved tree as YAML text (written to the run directory).
  std::string to_yaml() const;
  // A copy (sharing nothing with this one) whose existing top-level or
  // dotted `key` holds the string `value` (the run_id a run decided).
  Config with_value(const std::string& key, const std::string& value) const;
  const YAML::Node& root() const { return root_; }
  // Every leaf key, dotted.
  std::vector<std::string> leaf_keys() const;
  // The tree as JSON, scalars typed (bool, integer, number, string, null).
  nlohmann::json to_json() const;
  // Every leaf as "dotted.key" -> its text, as the recipe logs its params.
  std::map<std::string, std::string> flat() const;

 private:
  YAML::Node lookup(const std::string& key) const;
  // "missing key K in FILE", with the unread key of K's section nearest it.
  std::string missing_key_message(const std::string& key) const;
  YAML::Node root_;
  std::map<std::string, std::string> files_;  // group ("" for the rest) -> the file it came from
  std::shared_ptr<std::set<std::string>> known_ = std::make_shared<std::set<std::string>>();
};

// The configs directory: $SLIPSTREAM_CONFIG_DIR, else ./configs if present,
// else the source tree's configs/.
std::string default_config_dir();

// Levenshtein distance (for "did you mean").
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace slipstream::aero
