#include "aero/data/manifest.h"

#include "aero/data/sample_file.h"
#include "core/text/join.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <set>
#include <sstream>

namespace slipstream::aero {

namespace {

std::vector<std::string> string_list(const nlohmann::json& list, const std::string& where) {
  std::vector<std::string> out;
  for (const auto& e : list) {
    TORCH_CHECK(e.is_string(), where, " holds a non-string entry ", e.dump());
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

}  // namespace

Manifest read_manifest(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK(in.good(), "dataset: manifest '", path, "' is missing");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  Manifest m;
  m.path = path;
  const auto first = text.find_first_not_of(" \t\r\n");
  const bool json = first != std::string::npos && (text[first] == '{' || text[first] == '[');
  if (!json) {  // text: one entry per line
    std::stringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      line = trim(line);
      if (!line.empty() && line[0] != '#') m.entries.push_back(line);
    }
    return m;
  }
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "dataset: manifest '", path, "' is not valid JSON: ", e.what());
  }
  if (doc.is_array()) {
    m.entries = string_list(doc, "dataset: manifest '" + path + "'");
    return m;
  }
  m.named_splits = true;
  for (const auto& [key, value] : doc.items()) {
    if (key == "format") {
      m.format = value.is_string() ? value.get<std::string>() : value.dump();
      continue;
    }
    if (key == "source") continue;
    if (key == "checksums") {
      TORCH_CHECK(value.is_object(), "dataset: manifest '", path,
                  "' checksums must map sample files to numbers");
      for (const auto& [file, sum] : value.items()) {
        TORCH_CHECK(sum.is_number_unsigned() && sum.get<uint64_t>() <= UINT32_MAX,
                    "dataset: manifest '", path, "' checksum of '", file,
                    "' is not a 32-bit unsigned number");
        m.checksums[file] = sum.get<uint32_t>();
      }
      continue;
    }
    TORCH_CHECK(value.is_array(), "dataset: manifest '", path, "' split '", key,
                "' must be a list of samples");
    m.splits[key] = string_list(value, "dataset: manifest '" + path + "' split '" + key + "'");
  }
  return m;
}

void record_checksum(nlohmann::json& manifest, const std::string& dir, const std::string& name) {
  if (const auto sum = SampleFile(dir + "/" + name).fingerprint()) {
    manifest["checksums"][name] = *sum;
  }
}

void check_checksums(const Manifest& manifest, const std::string& dir,
                     const std::vector<std::string>& files) {
  if (manifest.checksums.empty()) return;  // written before manifests had them
  for (const auto& name : files) {
    const auto want = manifest.checksums.find(name);
    TORCH_CHECK(want != manifest.checksums.end(), "dataset: manifest '", manifest.path,
                "' records checksums but none for '", name,
                "': the directory was changed after it was written; prepare it again");
    const std::string path = dir + "/" + name;
    const auto got = SampleFile(path).fingerprint();
    TORCH_CHECK(got && *got == want->second, "dataset: sample file '", path,
                "' is not the file manifest '", manifest.path,
                "' recorded (it was replaced, or written by another prepare); prepare the dataset "
                "again");
  }
}

std::vector<std::string> Manifest::split_names() const {
  std::vector<std::string> out;
  for (const auto& [name, entries] : splits) out.push_back(name);
  return out;
}

const std::vector<std::string>& Manifest::split(const std::string& name) const {
  if (!named_splits) return entries;
  auto it = splits.find(name);
  TORCH_CHECK(it != splits.end(), "dataset: manifest '", path, "' has no split '", name,
              "' (it has: ", join(split_names(), ", ", "none"), ")");
  return it->second;
}

std::vector<size_t> match_entries(const std::vector<std::string>& entries,
                                  const std::vector<std::string>& samples,
                                  const std::string& manifest_path, const std::string& split) {
  std::vector<size_t> out;
  std::set<size_t> taken;
  for (const auto& entry : entries) {
    bool found = false;
    for (size_t i = 0; i < samples.size(); ++i) {
      const std::string& rel = samples[i];
      bool match = rel == entry || (rel.size() > entry.size() && rel[entry.size()] == '/' &&
                                    rel.compare(0, entry.size(), entry) == 0);
      // A parent directory component equal to the entry: run_1/x.pdmsh.
      for (size_t start = 0, slash; !match && (slash = rel.find('/', start)) != std::string::npos;
           start = slash + 1) {
        match = rel.compare(start, slash - start, entry) == 0 && slash - start == entry.size();
      }
      if (!match) continue;
      found = true;
      if (taken.insert(i).second) out.push_back(i);
    }
    TORCH_CHECK(found, "dataset: manifest '", manifest_path, "' lists '", entry, "' in split '",
                split, "', which names no sample (", samples.size(), " found)");
  }
  return out;
}

}  // namespace slipstream::aero
