#include "support/test_support.h"

#include <ftw.h>
#include <sys/stat.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <cstdio>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

namespace slipstream::testing {

TempDir::TempDir() {
  std::random_device rd;
  const auto base = std::filesystem::temp_directory_path();
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto candidate = base / ("slipstream-test-" + std::to_string(rd()));
    if (std::filesystem::create_directory(candidate)) {
      path_ = candidate.string();
      return;
    }
  }
  TORCH_CHECK(false, "TempDir: could not create a directory under ", base.string());
}

namespace {
int remove_entry(const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }
}  // namespace

// nftw rather than std::filesystem::remove_all: PyTorch 2.11's libtorch.so
// exports its own std::filesystem::remove_all, which crashes when called
// from code built with the system's libstdc++ (seen on the GPU image).
void remove_tree(const std::string& path) {
  nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

TempDir::~TempDir() { remove_tree(path_); }

std::string fixtures_dir() {
  if (const char* env = std::getenv("SLIPSTREAM_FIXTURES_DIR")) return env;
  return SLIPSTREAM_FIXTURES_DIR;
}

LandingProbe HeldSteps::probe() {
  LandingProbe p;
  p.has_landed = [this](const PendingStep& s) { return released.count(s.step) > 0; };
  p.wait = [this](const PendingStep& s) {
    waited.push_back(s.step);
    released.insert(s.step);
  };
  return p;
}

std::string error_message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> quick_train_overrides(const std::string& output_dir) {
  return {"model.n_layers=1",
          "model.n_hidden=32",
          "model.n_head=2",
          "model.slice_num=8",
          "dataset.num_train=6",
          "dataset.num_val=2",
          "dataset.points_per_sample=600",
          "dataset.sampling_resolution=256",
          "output_dir=" + output_dir,
          "device=cpu"};
}

std::vector<nlohmann::json> jsonl_records(const std::string& path, const std::string& key,
                                          const std::string& value) {
  std::vector<nlohmann::json> out;
  for (const auto& line : read_lines(path)) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value(key, std::string()) == value) out.push_back(std::move(j));
  }
  return out;
}

double relative_error(const at::Tensor& got, const at::Tensor& want) {
  const auto g = got.to(want.scalar_type());
  return ((g - want).norm() / want.norm().clamp_min(1e-30)).item<double>();
}

}  // namespace slipstream::testing
