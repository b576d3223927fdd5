#include "aero/config/config.h"

#include "core/text/join.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>

namespace slipstream::aero {

namespace fs = std::filesystem;

namespace {

const char* kGroups[] = {"model", "dataset"};

std::vector<std::string> split(const std::string& key) {
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string part; std::getline(ss, part, '.');) parts.push_back(part);
  return parts;
}

void collect_leaves(const YAML::Node& node, const std::string& prefix,
                    std::vector<std::string>& out) {
  if (node.IsMap()) {
    for (const auto& kv : node) {
      const std::string k = kv.first.as<std::string>();
      collect_leaves(kv.second, prefix.empty() ? k : prefix + "." + k, out);
    }
  } else {
    out.push_back(prefix);
  }
}

// A key given twice in one mapping: YAML forbids it, yaml-cpp keeps both
// and reads the first. Iterative, so that deep nesting cannot overflow.
void check_unique_keys(const YAML::Node& root, const std::string& path) {
  std::vector<std::pair<YAML::Node, std::string>> todo{{root, ""}};
  while (!todo.empty()) {
    const auto [node, prefix] = todo.back();
    todo.pop_back();
    if (node.IsMap()) {
      std::set<std::string> seen;
      for (const auto& kv : node) {
        const std::string key = kv.first.Scalar();
        TORCH_CHECK(seen.insert(key).second, "config: '", path, "' gives '", prefix + key,
                    "' twice (line ", kv.first.Mark().line + 1, ")");
        todo.emplace_back(kv.second, prefix + key + ".");
      }
    } else if (node.IsSequence()) {
      for (size_t i = 0; i < node.size(); ++i) {
        todo.emplace_back(node[i], prefix + std::to_string(i) + ".");
      }
    }
  }
}

YAML::Node load_file(const std::string& path) {
  TORCH_CHECK(fs::is_regular_file(path), "config: file '", path, "' does not exist");
  YAML::Node node;
  try {
    node = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    TORCH_CHECK(false, "config: '", path, "' is not valid YAML: ", e.what());
  }
  check_unique_keys(node, path);
  return node;
}

std::vector<std::string> group_choices(const std::string& dir, const std::string& group) {
  std::vector<std::string> names;
  if (fs::is_directory(dir + "/" + group)) {
    for (const auto& e : fs::directory_iterator(dir + "/" + group)) {
      if (e.path().extension() == ".yaml") names.push_back(e.path().stem().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

// The candidate nearest `key`: among those with the same last part
// (training.lr -> optimizer.lr) when there are any, by edit distance.
std::string closest(const std::string& key, const std::vector<std::string>& candidates) {
  const auto leaf = [](const std::string& k) { return k.substr(k.rfind('.') + 1); };
  const bool same_leaf = std::any_of(candidates.begin(), candidates.end(),
                                     [&](const std::string& c) { return leaf(c) == leaf(key); });
  std::string best;
  size_t best_d = static_cast<size_t>(-1);
  for (const auto& c : candidates) {
    if (same_leaf && leaf(c) != leaf(key)) continue;
    const size_t d = edit_distance(key, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

// Parses `text` as the type of `existing`; throws naming the key.
YAML::Node typed_value(const std::string& key, const YAML::Node& existing,
                       const std::string& text) {
  YAML::Node parsed;
  try {
    parsed = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    TORCH_CHECK(false, "config: value '", text, "' for '", key, "' is not valid YAML");
  }
  if (!existing.IsDefined() || existing.IsNull()) return parsed;
  if (existing.IsMap()) {
    TORCH_CHECK(parsed.IsMap(), "config: '", key,
                "' is a section; give a map like {name: value} "
                "or set one of its keys (",
                key, ".<name>=...)");
    return parsed;
  }
  if (existing.IsSequence()) {
    TORCH_CHECK(parsed.IsSequence(), "config: '", key, "' expects a list like [a, b], got '", text,
                "'");
    return parsed;
  }
  const std::string old = existing.as<std::string>();
  auto is_int = [](const YAML::Node& n) {
    int64_t v;
    return n.IsScalar() && YAML::convert<int64_t>::decode(n, v);
  };
  auto is_float = [](const YAML::Node& n) {
    double v;
    return n.IsScalar() && YAML::convert<double>::decode(n, v);
  };
  auto is_bool = [](const YAML::Node& n) {
    bool v;
    return n.IsScalar() && YAML::convert<bool>::decode(n, v);
  };
  if (is_bool(existing)) {
    TORCH_CHECK(is_bool(parsed), "config: '", key, "' expects true or false, got '", text, "'");
  } else if (is_int(existing)) {
    TORCH_CHECK(is_int(parsed), "config: '", key, "' expects an integer, got '", text, "'");
  } else if (is_float(existing)) {
    TORCH_CHECK(is_float(parsed), "config: '", key, "' expects a number, got '", text, "'");
  }
  (void)old;
  return parsed;
}

// Sets `value` at the dotted `key` below `node`, which must already hold it
// (as an override does); `where` names the key in messages.
void set_existing(YAML::Node node, const std::string& key, const YAML::Node& value,
                  const std::string& where, const std::string& file) {
  const auto parts = split(key);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    TORCH_CHECK(node.IsMap() && node[parts[i]], "config: ", where, ": '", file, "' has no key '",
                key, "'");
    node.reset(node[parts[i]]);
  }
  TORCH_CHECK(node.IsMap() && node[parts.back()], "config: ", where, ": '", file, "' has no key '",
              key, "'");
  node[parts.back()] = value;
}

void collect_leaves(const YAML::Node& node, const std::string& prefix,
                    std::vector<std::pair<std::string, YAML::Node>>& out) {
  if (node.IsMap() && node.size() > 0) {
    for (const auto& kv : node) {
      const std::string k = kv.first.as<std::string>();
      collect_leaves(kv.second, prefix.empty() ? k : prefix + "." + k, out);
    }
  } else {
    out.emplace_back(prefix, node);
  }
}

// One entry of extra_datasets: a dataset config's name, or {config: NAME,
// key: value, ...} overriding keys of that file; resolved to the file's
// tree with the overrides applied and config: NAME kept.
YAML::Node resolve_extra_dataset(const std::string& dir, const YAML::Node& entry, size_t i) {
  const std::string where = "extra_datasets[" + std::to_string(i) + "]";
  std::string name;
  if (entry.IsScalar()) {
    name = entry.as<std::string>();
  } else {
    TORCH_CHECK(entry.IsMap() && entry["config"] && entry["config"].IsScalar(), "config: ", where,
                " must be a dataset config's name or a map with config: NAME and keys to set");
    name = entry["config"].as<std::string>();
  }
  const auto choices = group_choices(dir, "dataset");
  TORCH_CHECK(std::find(choices.begin(), choices.end(), name) != choices.end(), "config: ", where,
              " names dataset '", name, "', which is not one of: ", join(choices));
  const std::string file = dir + "/dataset/" + name + ".yaml";
  YAML::Node tree = load_file(file);
  if (entry.IsMap()) {
    std::vector<std::pair<std::string, YAML::Node>> leaves;
    collect_leaves(entry, "", leaves);
    for (const auto& [key, value] : leaves) {
      if (key != "config") set_existing(tree, key, value, where, file);
    }
  }
  tree["config"] = name;
  return tree;
}

}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] =
          std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1] ? 1 : 0)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string default_config_dir() {
  if (const char* env = std::getenv("SLIPSTREAM_CONFIG_DIR")) return env;
  if (fs::is_regular_file("configs/train.yaml")) return "configs";
#ifdef SLIPSTREAM_SOURCE_CONFIG_DIR
  return SLIPSTREAM_SOURCE_CONFIG_DIR;
#else
  return "configs";
#endif
}

Config Config::load(const std::string& dir, const std::vector<std::string>& overrides) {
  Config cfg;
  YAML::Node root = load_file(dir + "/train.yaml");
  YAML::Node defaults = root["defaults"];
  std::map<std::string, std::string> picks;
  for (const char* g : kGroups) {
    TORCH_CHECK(defaults && defaults[g], "config: '", dir, "/train.yaml' needs defaults.", g);
    picks[g] = defaults[g].as<std::string>();
  }
  // Group picks first (model=NAME), so that key overrides apply to the pick.
  std::vector<std::pair<std::string, std::string>> key_values;
  for (const auto& o : overrides) {
    const auto eq = o.find('=');
    TORCH_CHECK(eq != std::string::npos && eq > 0, "config: override '", o,
                "' is not of the form key=value");
    const std::string key = o.substr(0, eq), value = o.substr(eq + 1);
    // YAML would fold a newline into a space: the value would not be the one given.
    const bool control = std::any_of(value.begin(), value.end(), [](char c) {
      return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
    });
    TORCH_CHECK(!control, "config: the value of '", key,
                "' holds a control character (a newline, a tab, ...); give it on one line");
    if (picks.count(key)) {
      const auto choices = group_choices(dir, key);
      TORCH_CHECK(std::find(choices.begin(), choices.end(), value) != choices.end(),
                  "config: ", key, "='", value, "' is not one of: ", join(choices),
                  choices.empty() ? "" : " (closest: '" + closest(value, choices) + "')");
      picks[key] = value;
    } else {
      key_values.emplace_back(key, value);
    }
  }
  root.remove("defaults");
  YAML::Node chosen;
  cfg.files_[""] = dir + "/train.yaml";
  for (const auto& [g, name] : picks) {
    cfg.files_[g] = dir + "/" + g + "/" + name + ".yaml";
    root[g] = load_file(cfg.files_[g]);
    chosen[g] = name;
    cfg.known_->insert("defaults." + g);
  }
  root["defaults"] = chosen;
  cfg.root_ = root;
  const auto leaves = cfg.leaf_keys();
  for (const auto& [key, value] : key_values) {
    TORCH_CHECK(key.rfind("defaults", 0) != 0, "config: set a group with ",
                key.substr(key.find('.') + 1), "=NAME, not ", key);
    const auto parts = split(key);
    YAML::Node node = cfg.root_;
    bool exists = true;
    for (const auto& p : parts) {
      if (!node.IsMap() || !node[p]) {
        exists = false;
        break;
      }
      node.reset(node[p]);
    }
    TORCH_CHECK(exists, "config: unknown key '", key, "' (closest valid key: '",
                closest(key, leaves), "')");
    YAML::Node parsed = typed_value(key, node, value);
    YAML::Node parent = cfg.root_;
    for (size_t i = 0; i + 1 < parts.size(); ++i) parent.reset(parent[parts[i]]);
    parent[parts.back()] = parsed;
  }
  if (cfg.root_["extra_datasets"] && cfg.root_["extra_datasets"].IsSequence()) {
    YAML::Node resolved(YAML::NodeType::Sequence);
    size_t i = 0;
    for (const auto& entry : cfg.root_["extra_datasets"]) {
      resolved.push_back(resolve_extra_dataset(dir, entry, i++));
    }
    cfg.root_["extra_datasets"] = resolved;
  }
  return cfg;
}

std::vector<std::pair<std::string, Config>> Config::extra_dataset_configs() const {
  std::vector<std::pair<std::string, Config>> out;
  const YAML::Node extras = lookup("extra_datasets");
  if (!extras.IsDefined() || extras.IsNull()) return out;
  TORCH_CHECK(extras.IsSequence(), "config: 'extra_datasets' must be a list of dataset configs");
  size_t i = 0;
  for (const auto& entry : extras) {
    TORCH_CHECK(entry.IsMap() && entry["config"], "config: extra_datasets[", i,
                "] is not a resolved dataset config (load the config with Config::load)");
    Config sub;
    sub.root_ = YAML::Clone(root_);
    YAML::Node dataset = YAML::Clone(entry);
    dataset.remove("config");
    sub.root_["dataset"] = dataset;
    sub.root_.remove("extra_datasets");
    out.emplace_back(entry["config"].as<std::string>(), sub);
    ++i;
  }
  return out;
}

Config Config::load_resolved(const std::string& path) {
  Config cfg;
  cfg.root_ = load_file(path);
  return cfg;
}

Config Config::parse_resolved(const std::string& yaml, const std::string& origin) {
  Config cfg;
  try {
    cfg.root_ = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    TORCH_CHECK(false, "config: the resolved config of ", origin, " does not parse: ", e.what());
  }
  TORCH_CHECK(cfg.root_.IsMap(), "config: the resolved config of ", origin, " is not a mapping");
  return cfg;
}

YAML::Node Config::lookup(const std::string& key) const {
  known_->insert(key);
  YAML::Node node = YAML::Clone(root_);
  for (const auto& p : split(key)) {
    if (!node.IsMap() || !node[p]) return YAML::Node(YAML::NodeType::Undefined);
    node.reset(node[p]);
  }
  return node;
}

bool Config::has(const std::string& key) const { return lookup(key).IsDefined(); }

YAML::Node Config::section(const std::string& key) const { return lookup(key); }

void Config::check_known_keys() const {
  if (files_.empty()) return;  // a resolved config read back: nothing to check
  std::vector<std::string> known(known_->begin(), known_->end());
  std::string unknown;
  for (const auto& leaf : leaf_keys()) {
    bool read = false;
    for (std::string k = leaf;; k = k.substr(0, k.rfind('.'))) {
      if (known_->count(k)) {
        read = true;
        break;
      }
      if (k.find('.') == std::string::npos) break;
    }
    if (read) continue;
    const std::string group = leaf.substr(0, leaf.find('.'));
    const std::string file = files_.count(group) ? files_.at(group) : files_.at("");
    unknown +=
        "\n  '" + leaf + "' in " + file + " (closest known key: '" + closest(leaf, known) + "')";
  }
  TORCH_CHECK(unknown.empty(), "config: unknown key(s), read by nothing:", unknown);
}

std::string Config::missing_key_message(const std::string& key) const {
  const std::string group = key.substr(0, key.find('.'));
  const auto file = files_.count(group) ? files_.find(group) : files_.find("");
  std::string out = "config: missing key '" + key + "'";
  if (file != files_.end()) out += " in " + file->second;
  // A key that is there but read by nothing yet is likely this one renamed.
  std::vector<std::string> unread;
  for (const auto& leaf : leaf_keys()) {
    if (leaf.substr(0, leaf.find('.')) != group) continue;
    bool read = false;  // it, or a section holding it
    for (std::string k = leaf; !read; k = k.substr(0, k.rfind('.'))) {
      read = known_->count(k) > 0;
      if (k.find('.') == std::string::npos) break;
    }
    if (!read) unread.push_back(leaf);
  }
  if (!unread.empty()) out += " (it has '" + closest(key, unread) + "': renamed?)";
  return out;
}

bool Config::is_null(const std::string& key) const {
  auto n = lookup(key);
  TORCH_CHECK(n.IsDefined(), missing_key_message(key));
  return n.IsNull();
}

template <class T>
T Config::get(const std::string& key) const {
  auto n = lookup(key);
  TORCH_CHECK(n.IsDefined(), missing_key_message(key));
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    TORCH_CHECK(false, "config: key '", key, "' has value '", YAML::Dump(n), "' of the wrong type");
  }
}

template int64_t Config::get<int64_t>(const std::string&) const;
template int Config::get<int>(const std::string&) const;
template double Config::get<double>(const std::string&) const;
template bool Config::get<bool>(const std::string&) const;
template std::string Config::get<std::string>(const std::string&) const;
template std::vector<std::string> Config::get<std::vector<std::string>>(const std::string&) const;
template std::vector<double> Config::get<std::vector<double>>(const std::string&) const;

std::string Config::to_yaml() const {
  YAML::Emitter out;
  out << root_;
  return std::string(out.c_str()) + "\n";
}

Config Config::with_value(const std::string& key, const std::string& value) const {
  Config out = *this;
  out.root_ = YAML::Clone(root_);
  out.known_ = std::make_shared<std::set<std::string>>(*known_);
  set_existing(out.root_, key, YAML::Node(value), "with_value", "the resolved config");
  return out;
}

std::vector<std::string> Config::leaf_keys() const {
  std::vector<std::string> out;
  collect_leaves(root_, "", out);
  return out;
}

namespace {

nlohmann::json yaml_to_json(const YAML::Node& n) {
  if (n.IsMap()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& kv : n) j[kv.first.as<std::string>()] = yaml_to_json(kv.second);
    return j;
  }
  if (n.IsSequence()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& v : n) j.push_back(yaml_to_json(v));
    return j;
  }
  if (!n.IsDefined() || n.IsNull()) return nullptr;
  bool b = false;
  int64_t i = 0;
  double d = 0.0;
  if (YAML::convert<bool>::decode(n, b)) return b;
  if (YAML::convert<int64_t>::decode(n, i)) return i;
  if (YAML::convert<double>::decode(n, d)) return d;
  return n.as<std::string>();
}

void flatten(const YAML::Node& n, const std::string& prefix,
             std::map<std::string, std::string>& out) {
  if (n.IsMap()) {
    for (const auto& kv : n) {
      const std::string k = kv.first.as<std::string>();
      flatten(kv.second, prefix.empty() ? k : prefix + "." + k, out);
    }
    return;
  }
  if (n.IsScalar()) {
    out[prefix] = n.as<std::string>();
  } else if (n.IsNull() || !n.IsDefined()) {
    out[prefix] = "None";
  } else {
    out[prefix] = yaml_to_json(n).dump();
  }
}

}  // namespace

nlohmann::json Config::to_json() const { return yaml_to_json(root_); }

std::map<std::string, std::string> Config::flat() const {
  std::map<std::string, std::string> out;
  flatten(root_, "", out);
  return out;
}

void check_positive(const std::string& key, double v) {
  TORCH_CHECK(v > 0, "config: '", key, "' must be > 0, got ", v);
}

void check_one_of(const std::string& key, const std::string& value,
                  std::initializer_list<const char*> allowed) {
  check_one_of(key, value, std::vector<std::string>(allowed.begin(), allowed.end()));
}

void check_one_of(const std::string& key, const std::string& value,
                  const std::vector<std::string>& allowed) {
  std::string list;
  for (const auto& a : allowed) {
    if (value == a) return;
    list += (list.empty() ? "" : ", ") + a;
  }
  TORCH_CHECK(false, "config: '", key, "' is '", value, "', expected one of: ", list);
}

}  // namespace slipstream::aero
