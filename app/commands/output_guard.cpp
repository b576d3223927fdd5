#include "commands/output_guard.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace slipstream::app {

namespace fs = std::filesystem;

namespace {

fs::path absolute_of(const std::string& p) {
  std::error_code ec;
  const auto a = fs::weakly_canonical(fs::absolute(p), ec);
  return ec ? fs::absolute(p).lexically_normal() : a;
}

// Whether `p` is `root` or lies inside it.
bool within(const fs::path& p, const fs::path& root) {
  auto r = root.begin(), q = p.begin();
  for (; r != root.end() && !r->empty(); ++r, ++q) {
    if (q == p.end() || *q != *r) return false;
  }
  return true;
}

// The training run `dir` is, or "".
std::string run_marker(const fs::path& dir) {
  for (const char* marker : {"checkpoints", "resolved_config.yaml", ".lock"}) {
    if (fs::exists(dir / marker)) return marker;
  }
  return "";
}

// A directory output may not be an input directory (or a file input's
// directory); a file output may not be an input file or lie inside an
// input directory (a raw run would read it back as its own).
void check_not_an_input(const fs::path& out, const std::string& shown,
                        const std::vector<std::string>& inputs, bool out_is_directory) {
  for (const auto& input : inputs) {
    if (input.empty()) continue;
    const auto in = absolute_of(input);
    const bool file_input = fs::is_regular_file(in);
    const bool lands = out_is_directory ? out == (file_input ? in.parent_path() : in)
                                        : (file_input ? out == in : within(out, in));
    TORCH_CHECK(!lands, "output '", shown, "' would land on the input '", input,
                "'; give an --out outside it");
  }
}

}  // namespace

bool first_record_is(const std::string& path, const std::string& phase) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return false;
  const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.value("phase", "") == phase;
}

void check_output_directory(const std::string& dir, const std::vector<std::string>& inputs,
                            const std::string& own,
                            const std::function<bool(const std::string&)>& ours) {
  const auto out = absolute_of(dir);
  check_not_an_input(out, dir, inputs, /*out_is_directory=*/true);
  const std::string marker = run_marker(out);
  TORCH_CHECK(marker.empty(), "output directory '", dir, "' is a training run (it holds ", marker,
              "); give an --out of its own, e.g. '", (fs::path(dir) / "infer").string(), "'");
  TORCH_CHECK(!fs::exists(out / "manifest.json"), "output directory '", dir,
              "' is a dataset (it holds manifest.json); give an --out of its own");
  const auto existing = out / own;
  TORCH_CHECK(!fs::exists(existing) || ours(existing.string()), "output directory '", dir,
              "' holds a '", own,
              "' this command did not write; it would be replaced: "
              "give another --out or remove it");
}

void check_output_file(const std::string& file, const std::vector<std::string>& inputs,
                       const std::function<bool(const std::string&)>& ours) {
  const auto out = absolute_of(file);
  check_not_an_input(out, file, inputs, /*out_is_directory=*/false);
  TORCH_CHECK(out.parent_path().filename() != "checkpoints" ||
                  run_marker(out.parent_path().parent_path()).empty(),
              "output '", file, "' lies in a training run's checkpoints/; give another --out");
  TORCH_CHECK(!fs::exists(out) || ours(out.string()), "output '", file,
              "' exists and was not written by this command; it would be replaced: give another "
              "--out or remove it");
}

}  // namespace slipstream::app
