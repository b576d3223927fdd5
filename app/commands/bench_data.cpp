// slipstream bench-data: the host cost of one training step's data, from
// sample files on disk, as a function of the sample's size. For each size
// it writes a random-valued volume sample (points, sdf, sdf_normals,
// velocity, pressure, nut: 12 floats a point) twice — in the sampling
// layout (sample_file.h) and as version 1 wrote it (rows in order, read
// whole) — then times the loader's work for `--keep` points a step: the
// dataset read and the host batch (inputs and targets). The file's pages
// are dropped from the page cache before every timed step (posix_fadvise
// DONTNEED), so each step reads from the disk; `--warmup` untimed steps
// come first. Prints a table and one JSON
// line per size and layout.
#include "aero/data/dataset.h"
#include "aero/data/loader.h"
#include "aero/data/sample_file.h"
#include "commands/commands.h"
#include "core/io/random_access_file.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

namespace slipstream::app {

namespace {

struct BenchDataOptions {
  std::string dir;
  std::vector<int64_t> sizes{1000000, 10000000, 50000000};
  int64_t keep = 200000;
  int steps = 10;
  int warmup = 2;                // untimed steps first (allocator and CPU warm-up), cold too
  int whole_steps = 3;           // for the version-1 layout (each reads the whole file)
  int64_t whole_max = 10000000;  // version-1 files only up to this size
  bool keep_files = false;
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

aero::Sample random_volume_sample(int64_t n) {
  aero::Sample s;
  s.id = "random:" + std::to_string(n);
  auto gen = at::detail::createCPUGenerator(n);
  auto rand = [&](int64_t c) { return torch::rand({n, c}, gen, torch::kFloat); };
  s.point_data["points"] = rand(3);
  s.point_data["sdf"] = rand(1);
  s.point_data["sdf_normals"] = rand(3);
  s.point_data["velocity"] = rand(3);
  s.point_data["pressure"] = rand(1);
  s.point_data["nut"] = rand(1);
  s.global_data["U_inf"] = torch::tensor({30.f, 0.f, 0.f});
  s.global_data["L_ref"] = torch::tensor({4.f});
  return s;
}

aero::LoaderOptions loader_options(int64_t keep) {
  aero::LoaderOptions o;
  o.sampling_resolution = keep;
  o.inputs =
      aero::InputSpec({{"embedding", aero::InputSource{{"points", "sdf", "sdf_normals"}, ""}},
                       {"fx", aero::InputSource{{"U_inf"}, "embedding"}}});
  return o;
}

struct Timing {
  std::vector<double> read_ms, batch_ms;
  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  }
};

Timing time_steps(const std::string& dir, const std::string& file, int64_t keep, int warmup,
                  int steps) {
  const aero::DirectoryDataset dataset(dir, {file});
  const aero::LoaderOptions o = loader_options(keep);
  const RandomAccessFile handle(dir + "/" + file);
  Timing t;
  for (int step = -warmup; step < steps; ++step) {
    handle.drop_cache();
    const auto draw = static_cast<uint64_t>(step + warmup);
    aero::PointRequest r{keep, "random", draw + 1, draw * 7919 + 1, step + warmup};
    const auto t0 = Clock::now();
    const aero::Sample s = dataset.get(0, r);
    const double read = seconds_since(t0);
    const aero::Batch b = aero::make_host_batch(s, o, r.seed);
    const double total = seconds_since(t0);
    TORCH_CHECK(b.target.size(1) == keep, "bench-data: a step kept ", b.target.size(1),
                " points, not ", keep);
    if (step < 0) continue;
    t.read_ms.push_back(read * 1e3);
    t.batch_ms.push_back(total * 1e3);
  }
  return t;
}

int run_bench_data(const BenchDataOptions& o) {
  TORCH_CHECK(!o.dir.empty(), "bench-data: --dir is required (the samples are written there)");
  std::filesystem::create_directories(o.dir);
  std::printf("%12s %-10s %10s %12s %12s %12s\n", "points", "layout", "file MB", "write s",
              "read ms", "step ms");
  for (const int64_t n : o.sizes) {
    TORCH_CHECK(n > o.keep, "bench-data: size ", n, " is not above --keep ", o.keep);
    const aero::Sample sample = random_volume_sample(n);
    for (const bool permuted : {true, false}) {
      if (!permuted && n > o.whole_max) continue;
      const std::string name =
          std::string(permuted ? "v2_" : "v1_") + std::to_string(n) + ".safetensors";
      const std::string path = o.dir + "/" + name;
      aero::SampleWriteOptions w;
      w.permute = permuted;
      const auto t0 = Clock::now();
      aero::write_sample_file(path, sample, w);
      const double write_s = seconds_since(t0);
      const double mb = static_cast<double>(std::filesystem::file_size(path)) / 1e6;
      const Timing t =
          time_steps(o.dir, name, o.keep, o.warmup, permuted ? o.steps : o.whole_steps);
      const char* layout = permuted ? "sampling" : "v1 (whole)";
      std::printf("%12lld %-10s %10.0f %12.1f %12.1f %12.1f\n", static_cast<long long>(n), layout,
                  mb, write_s, Timing::median(t.read_ms), Timing::median(t.batch_ms));
      nlohmann::json j{{"points", n},
                       {"layout", permuted ? "sampling" : "v1"},
                       {"keep", o.keep},
                       {"file_mb", mb},
                       {"write_s", write_s},
                       {"read_ms", t.read_ms},
                       {"step_ms", t.batch_ms},
                       {"read_ms_median", Timing::median(t.read_ms)},
                       {"step_ms_median", Timing::median(t.batch_ms)},
                       {"cache", "dropped before each step"}};
      std::cout << j.dump() << std::endl;
      if (!o.keep_files) std::filesystem::remove(path);
    }
  }
  return 0;
}

}  // namespace

Command add_bench_data(CLI::App& app, const CommandContext&) {
  auto o = std::make_shared<BenchDataOptions>();
  auto* sub = app.add_subcommand(
      "bench-data", "time a step's data read and host batch from samples on disk, by sample size");
  sub->add_option("--dir", o->dir, "where to write the samples (a local disk to measure)")
      ->required();
  sub->add_option_function<std::string>(
      "--sizes",
      [o](const std::string& list) {
        o->sizes.clear();
        std::stringstream ss(list);
        for (std::string v; std::getline(ss, v, ',');) o->sizes.push_back(std::stoll(v));
      },
      "points per sample, comma-separated (default 1000000,10000000,50000000)");
  sub->add_option("--keep", o->keep, "points a step keeps (default 200000)");
  sub->add_option("--steps", o->steps, "timed steps per size (default 10)");
  sub->add_option("--warmup", o->warmup, "untimed steps before them (default 2)");
  sub->add_option("--whole-steps", o->whole_steps,
                  "timed steps of the version-1 layout, which reads whole samples (default 3)");
  sub->add_option("--whole-max", o->whole_max,
                  "largest size to time in the version-1 layout (default 10000000)");
  sub->add_flag("--keep-files", o->keep_files, "leave the sample files in --dir");
  return {sub, [o] { return run_bench_data(*o); }};
}

}  // namespace slipstream::app
