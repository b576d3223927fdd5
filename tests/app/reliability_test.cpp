// Nothing lost, nothing silent: the slipstream executable under faults and
// bad input, as a user meets them. Each test asserts the exit code, the
// message and what is left on disk: checkpoints (checksums, another
// config, all damaged, keep_last, start over), non-finite values, resumes
// that continue the logs, signals (one and two, through the launcher too),
// ownership of the run directory, ranks that die, hang or never come, full
// and read-only disks, and config keys that nothing reads.
#include "core/distributed/process_group.h"
#include "core/io/random_access_file.h"
#include "core/io/safetensors.h"
#include "core/sinks/event_file_writer.h"
#include "support/multiprocess.h"
#include "support/process.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>

namespace slipstream {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::eventually;
using testing::Exit;
using testing::Process;
using testing::run_slipstream;

// A small, fast run: 6 steps an epoch of a 1-layer model.
std::vector<std::string> tiny(const std::string& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"train"};
  for (auto& k : testing::quick_train_overrides(out)) o.push_back(std::move(k));
  for (const char* k :
       {"training.num_epochs=2", "run_id=r", "logging.console_every_n_steps=1000"}) {
    o.emplace_back(k);
  }
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

// A run slow enough to signal mid-epoch: 400 steps an epoch.
std::vector<std::string> long_run(const std::string& out, std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), "training.steps_per_epoch=400");
  return tiny(out, extra);
}

std::vector<nlohmann::json> records(const std::string& path, const std::string& phase) {
  return testing::jsonl_records(path, "phase", phase);
}

size_t train_steps_logged(const std::string& run) {
  return records(run + "/metrics.jsonl", "train_step").size();
}

// 3 train and 1 val synthetic samples of 400 points, written to <dir>/data.
std::string make_small_dataset(const std::string& dir) {
  const std::string data = dir + "/data";
  const Exit e = run_slipstream({"make-synthetic", "--out", data, "dataset.num_train=3",
                                 "dataset.num_val=1", "dataset.points_per_sample=400"});
  EXPECT_EQ(e.code, 0) << e.output;
  return data;
}

// The sample file `from` written to `to` as version 1 wrote samples (no
// checksums, rows as they are), each tensor through `edit`.
void write_as_v1(
    const std::string& from, const std::string& to,
    const std::function<at::Tensor(const std::string&, const at::Tensor&)>& edit = nullptr) {
  const auto f = read_safetensors(from);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, t] : f.tensors) {
    if (name.rfind("checksum/", 0) == 0) continue;
    tensors.emplace_back(name, edit ? edit(name, t.clone()) : t.clone());
  }
  write_safetensors(to, tensors,
                    {{"format", "slipstream-samples-v1"}, {"globals", f.metadata.at("globals")}});
}

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every checkpoint's name and bytes.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    out[e.path().filename().string()] = contents(e.path().string());
  }
  return out;
}

// The dataset's manifest as versions before per-sample checksums wrote it.
void drop_manifest_checksums(const std::string& data) {
  std::ifstream in(data + "/manifest.json");
  auto manifest = nlohmann::json::parse(in);
  in.close();
  ASSERT_TRUE(manifest.contains("checksums"));
  manifest.erase("checksums");
  std::ofstream(data + "/manifest.json", std::ios::trunc) << manifest.dump(2);
}

// A sample file changed after it was written: row 7's pressure becomes NaN
// in place.
void poison_pressure_row_7(const std::string& sample) {
  const RandomAccessFile f(sample);
  const auto pressure = read_safetensors_index(f).at("pressure");
  std::fstream io(sample, std::ios::in | std::ios::out | std::ios::binary);
  io.seekp(static_cast<std::streamoff>(pressure.offset + 7 * sizeof(float)));
  const float nan = NAN;
  io.write(reinterpret_cast<const char*>(&nan), sizeof(nan));
}

// Flips one bit in the middle of a file's tensor data.
void flip_a_bit(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const auto size = static_cast<std::streamoff>(f.tellg());
  f.seekg(size - 64);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp(size - 64);
  f.write(&c, 1);
}

// --- checkpoints ----------------------------------------------------------

TEST(ReliabilityTest,
     ResumingWithAnotherModelConfigIsAnErrorThatListsMismatchesAndKeepsCheckpoints) {
  testing::TempDir dir;
  ASSERT_EQ(run_slipstream(tiny(dir.path())).code, 0);
  const auto before = snapshot(dir.path() + "/r/checkpoints");
  ASSERT_EQ(before.size(), 3u);  // epochs 1 and 2, and the best of them
  const Exit e = run_slipstream(tiny(dir.path(), {"model.n_hidden=16", "training.num_epochs=3"}));
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, "another config");
  // The config key first, then a few of the tensors it changes.
  EXPECT_OUTPUT_HAS(e, "model.n_hidden: 32 in the checkpoint, 16 now");
  EXPECT_OUTPUT_HAS(e, "so its tensors differ:");
  EXPECT_OUTPUT_HAS(e, " more");
  EXPECT_OUTPUT_HAS(e, "Nothing was loaded or overwritten");
  EXPECT_EQ(snapshot(dir.path() + "/r/checkpoints"), before);
}

TEST(ReliabilityTest, ResumingWithAnotherOptimizerIsAnErrorBeforeAnyWeightIsLoaded) {
  testing::TempDir dir;
  ASSERT_EQ(run_slipstream(tiny(dir.path())).code, 0);
  const auto before = snapshot(dir.path() + "/r/checkpoints");
  const Exit e =
      run_slipstream(tiny(dir.path(), {"optimizer.name=adamw", "training.num_epochs=3"}));
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, "optimizer.name: muon in the checkpoint, adamw now");
  EXPECT_OUTPUT_HAS(e, "'optim.");
  EXPECT_EQ(snapshot(dir.path() + "/r/checkpoints"), before);
  EXPECT_EQ(train_steps_logged(dir.path() + "/r"), 12u);  // nothing trained, nothing logged
}

TEST(ReliabilityTest, AFlippedBitIsCaughtByItsChecksumAndTheCheckpointBeforeItResumes) {
  testing::TempDir dir;
  ASSERT_EQ(run_slipstream(tiny(dir.path())).code, 0);
  const std::string newest = dir.path() + "/r/checkpoints/checkpoint_epoch_0002.safetensors";
  flip_a_bit(newest);
  const Exit e = run_slipstream(tiny(dir.path(), {"training.num_epochs=3"}));
  EXPECT_EQ(e.code, 0) << e.output;
  EXPECT_OUTPUT_HAS(e, newest + "' is damaged: tensor");
  EXPECT_OUTPUT_HAS(e, "checkpoint_epoch_0001.safetensors (1 epochs");
  // Epochs 2 and 3 were trained again: every step logged once, in order.
  const auto steps = records(dir.path() + "/r/metrics.jsonl", "train_step");
  ASSERT_EQ(steps.size(), 18u);
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i]["global_step"], i);
}

TEST(ReliabilityTest, WhenEveryCheckpointIsDamagedTheRunFailsInsteadOfStartingOver) {
  testing::TempDir dir;
  ASSERT_EQ(run_slipstream(tiny(dir.path())).code, 0);
  for (const auto& e : fs::directory_iterator(dir.path() + "/r/checkpoints")) {
    // best.safetensors is a hard link to one of them: damaged with it.
    if (e.path().filename() != "best.safetensors") flip_a_bit(e.path().string());
  }
  const auto before = snapshot(dir.path() + "/r/checkpoints");
  const Exit e = run_slipstream(tiny(dir.path(), {"training.num_epochs=3"}));
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, "every checkpoint in");
  EXPECT_OUTPUT_HAS(e, "does not start over on its own");
  EXPECT_EQ(snapshot(dir.path() + "/r/checkpoints"), before);
}

TEST(ReliabilityTest, AKillDuringACheckpointWriteResumesFromTheNewestCompleteOne) {
  testing::TempDir dir;
  ASSERT_EQ(run_slipstream(tiny(dir.path())).code, 0);
  // What a writer killed mid-write can leave: a temp file, and (from a
  // non-atomic writer) a truncated file under a final name.
  const std::string ckpt = dir.path() + "/r/checkpoints/";
  std::ofstream(ckpt + "checkpoint_epoch_0003.safetensors.tmp") << "partial";
  fs::copy_file(ckpt + "checkpoint_epoch_0002.safetensors",
                ckpt + "checkpoint_epoch_0003.safetensors");
  fs::resize_file(ckpt + "checkpoint_epoch_0003.safetensors", 1000);
  const Exit e = run_slipstream(tiny(dir.path(), {"training.num_epochs=3"}));
  EXPECT_EQ(e.code, 0) << e.output;
  EXPECT_OUTPUT_HAS(e, "checkpoint_epoch_0002.safetensors (2 epochs");
}

TEST(ReliabilityTest, KeepLastPrunesOlderCheckpointsOnceTheNewOneIsWritten) {
  testing::TempDir dir;
  ASSERT_EQ(
      run_slipstream(tiny(dir.path(), {"training.num_epochs=5", "training.keep_last=2"})).code, 0);
  std::set<std::string> names;
  for (const auto& [name, bytes] : snapshot(dir.path() + "/r/checkpoints")) names.insert(name);
  EXPECT_EQ(names, (std::set<std::string>{"best.safetensors", "checkpoint_epoch_0004.safetensors",
                                          "checkpoint_epoch_0005.safetensors"}));
  const Exit bad = run_slipstream(tiny(dir.path(), {"training.keep_last=1"}));
  EXPECT_EQ(bad.code, 1);
  EXPECT_OUTPUT_HAS(bad, "training.keep_last");
}

TEST(ReliabilityTest, ResumeFalseOnARunWithCheckpointsRefusesUnlessToldToStartOver) {
  testing::TempDir dir;
  ASSERT_EQ(run_slipstream(tiny(dir.path())).code, 0);
  const auto before = snapshot(dir.path() + "/r/checkpoints");
  const Exit refused = run_slipstream(tiny(dir.path(), {"training.resume=false"}));
  EXPECT_EQ(refused.code, 1) << refused.output;
  EXPECT_OUTPUT_HAS(refused, "training.start_over=true");
  EXPECT_EQ(snapshot(dir.path() + "/r/checkpoints"), before);
  const Exit over =
      run_slipstream(tiny(dir.path(), {"training.start_over=true", "training.num_epochs=1"}));
  EXPECT_EQ(over.code, 0) << over.output;
  EXPECT_EQ(snapshot(dir.path() + "/r/checkpoints").size(),
            2u);                                         // epoch 1 and best: the old ones are gone
  EXPECT_EQ(train_steps_logged(dir.path() + "/r"), 6u);  // and so are their logs
}

// --- non-finite values and bad samples --------------------------------------

TEST(ReliabilityTest, ANonFiniteLossStopsTheRunNamingStepRankAndFieldWithExitCode3) {
  testing::TempDir dir;
  const Exit e = run_slipstream(
      tiny(dir.path(), {"optimizer.name=adamw", "optimizer.lr=1e30", "training.num_epochs=1"}));
  EXPECT_EQ(e.code, 3) << e.output;
  EXPECT_OUTPUT_HAS(e, "non-finite");
  EXPECT_OUTPUT_HAS(e, "on rank 0");
  EXPECT_NE(e.output.find("train: step "), std::string::npos) << e.output;
  // No checkpoint holds it.
  EXPECT_TRUE(snapshot(dir.path() + "/r/checkpoints").empty());
}

TEST(ReliabilityTest, ASampleWithANaNFieldIsNamedWithItsFileAndFieldAndExits1) {
  testing::TempDir dir;
  const std::string data = make_small_dataset(dir.path());
  ASSERT_FALSE(HasFailure());
  const std::string victim = data + "/sample_00001.safetensors";
  poison_pressure_row_7(victim);
  // Steps keep 256 of 400 rows, consecutive epochs the next block: the two
  // epochs read every row.
  const Exit e = run_slipstream(tiny(dir.path(), {"dataset.path=" + data}));
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, victim);
  EXPECT_OUTPUT_HAS(e, "field 'pressure' rows [0, 400) changed after the file was written");
  EXPECT_OUTPUT_HAS(e, "row 7 is not finite");
  EXPECT_TRUE(snapshot(dir.path() + "/r/checkpoints").empty());
}

TEST(ReliabilityTest, SamplesWrittenBeforeTheSamplingLayoutStillTrainWithANote) {
  testing::TempDir dir;
  const std::string data = make_small_dataset(dir.path());
  ASSERT_FALSE(HasFailure());
  // As version 1 wrote them: no checksums, no row order, no points mean.
  for (int i = 0; i < 4; ++i) {
    const std::string path = data + "/sample_0000" + std::to_string(i) + ".safetensors";
    write_as_v1(path, path);
  }
  drop_manifest_checksums(data);
  const Exit e = run_slipstream(tiny(dir.path(), {"dataset.path=" + data}));
  EXPECT_EQ(e.code, 0) << e.output;
  EXPECT_OUTPUT_HAS(e, "was written before slipstream-samples-v2");
  EXPECT_GT(train_steps_logged(dir.path() + "/r"), 0u);
}

TEST(ReliabilityTest, InferRefusesANonFiniteInputNamingTheSampleAndWritesNothingForIt) {
  testing::TempDir dir;
  const std::string data = make_small_dataset(dir.path());
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(
      run_slipstream(tiny(dir.path(), {"dataset.path=" + data, "training.num_epochs=1"})).code, 0);
  // Samples to predict, written as the first format wrote them (nothing
  // checked them then): one NaN coordinate, one infinite free stream.
  const std::string bad = dir.path() + "/bad";
  std::filesystem::create_directories(bad);
  for (const std::string which : {"points", "U_inf"}) {
    write_as_v1(data + "/sample_00003.safetensors", bad + "/" + which + ".safetensors",
                [&](const std::string& name, at::Tensor t) {
                  if (name == which)
                    t.view(-1)[which == "points" ? 16 : 0] = which == "points" ? NAN : INFINITY;
                  return t;
                });
    std::ofstream(bad + "/manifest.json") << R"({"val": [")" << which << R"(.safetensors"]})";
    const std::string out = dir.path() + "/pred_" + which;
    const Exit e = run_slipstream({"infer", "--checkpoint", dir.path() + "/r", "--split", "val",
                                   "--data", bad, "--out", out, "--device", "cpu"});
    EXPECT_EQ(e.code, 1) << e.output;
    EXPECT_OUTPUT_HAS(e, bad + "/" + which + ".safetensors");
    EXPECT_OUTPUT_HAS(e, which == "points" ? "field 'points' row 5 is not finite"
                                           : "global 'U_inf' is not finite");
    EXPECT_FALSE(std::filesystem::exists(out + "/" + which + ".vtu"));
  }
}

TEST(ReliabilityTest, AValSamplesWrongRowCountIsFoundBeforeTheFirstStep) {
  testing::TempDir dir;
  const std::string data = make_small_dataset(dir.path());
  ASSERT_FALSE(HasFailure());
  const std::string victim = data + "/sample_00003.safetensors";  // val: read after an epoch
  write_as_v1(victim, victim, [](const std::string& name, const at::Tensor& t) {
    return name == "pressure" ? t.narrow(0, 0, 399).clone() : t;
  });
  drop_manifest_checksums(data);  // else the manifest's checksum finds it first
  const Exit e = run_slipstream(tiny(dir.path(), {"dataset.path=" + data}));
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, victim);
  EXPECT_OUTPUT_HAS(e, "point field 'pressure' has shape [399, 1]: one row per point (400)");
  EXPECT_EQ(train_steps_logged(dir.path() + "/r"), 0u);
}

// The manifest records each sample file's fingerprint: a file swapped for
// another (here a train sample for the val one) is refused before the
// first step, naming it.
TEST(ReliabilityTest, ASampleFileReplacedByAnotherIsFoundBeforeTheFirstStep) {
  testing::TempDir dir;
  const std::string data = make_small_dataset(dir.path());
  ASSERT_FALSE(HasFailure());
  const std::string a = data + "/sample_00000.safetensors", b = data + "/sample_00003.safetensors";
  fs::rename(a, data + "/swap");
  fs::rename(b, a);
  fs::rename(data + "/swap", b);
  const Exit e = run_slipstream(tiny(dir.path(), {"dataset.path=" + data}));
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, "sample file '" + a + "' is not the file manifest '");
  EXPECT_EQ(train_steps_logged(dir.path() + "/r"), 0u);
  // Put back, it trains.
  fs::rename(a, data + "/swap");
  fs::rename(b, a);
  fs::rename(data + "/swap", b);
  const Exit ok = run_slipstream(tiny(dir.path(), {"dataset.path=" + data}));
  EXPECT_EQ(ok.code, 0) << ok.output;
}

TEST(ReliabilityTest, NoOutputLandsOnARunADatasetAnInputOrAFileItDidNotWrite) {
  testing::TempDir dir;
  const std::string data = make_small_dataset(dir.path());
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(
      run_slipstream(tiny(dir.path(), {"dataset.path=" + data, "training.num_epochs=1"})).code, 0);
  const std::string run = dir.path() + "/r";
  const auto before = snapshot(run + "/checkpoints");
  const auto metrics_size = fs::file_size(run + "/metrics.jsonl");
  const std::string newest = run + "/checkpoints/checkpoint_epoch_0001.safetensors";
  auto infer = [&](const std::string& out, std::vector<std::string> more = {},
                   const std::string& checkpoint = "") {
    std::vector<std::string> args{"infer",   "--checkpoint", checkpoint.empty() ? run : checkpoint,
                                  "--split", "val",          "--out",
                                  out,       "--device",     "cpu"};
    args.insert(args.end(), more.begin(), more.end());
    return run_slipstream(args);
  };
  // The training run itself: given as --checkpoint, or holding the checkpoint.
  Exit e = infer(run);
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, "would land on the input");
  e = infer(run, {}, newest);
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, "is a training run");
  EXPECT_EQ(fs::file_size(run + "/metrics.jsonl"), metrics_size);
  // The dataset it reads.
  e = infer(data, {"--data", data});
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, "would land on the input");
  // A directory whose metrics.jsonl is someone else's.
  fs::create_directories(dir.path() + "/mine");
  std::ofstream(dir.path() + "/mine/metrics.jsonl") << "{\"phase\": \"train_step\"}\n";
  e = infer(dir.path() + "/mine");
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, "did not write");
  // Its own output, twice: the second replaces the first.
  EXPECT_EQ(infer(dir.path() + "/pred").code, 0);
  e = infer(dir.path() + "/pred");
  EXPECT_EQ(e.code, 0) << e.output;
  // export: never over a checkpoint or a file that is not a .mdlus.
  e = run_slipstream({"export", "--checkpoint", run, "--out", newest});
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, "checkpoints/");
  std::ofstream(dir.path() + "/notes.txt") << "mine";
  e = run_slipstream({"export", "--checkpoint", run, "--out", dir.path() + "/notes.txt"});
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, "was not written by this command");
  EXPECT_EQ(run_slipstream({"export", "--checkpoint", run, "--out", dir.path() + "/m.mdlus"}).code,
            0);
  EXPECT_EQ(run_slipstream({"export", "--checkpoint", run, "--out", dir.path() + "/m.mdlus"}).code,
            0);
  EXPECT_EQ(snapshot(run + "/checkpoints"), before);
}

TEST(ReliabilityTest, EverySampleHeaderIsCheckedBeforeTheFirstStep) {
  testing::TempDir dir;
  const std::string data = make_small_dataset(dir.path());
  ASSERT_FALSE(HasFailure());
  // The val sample (read only after a train epoch) lacks its pressure.
  const std::string victim = data + "/sample_00003.safetensors";
  auto f = read_safetensors(victim);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (auto& [name, t] : f.tensors) {
    if (name != "pressure") tensors.emplace_back(name, t.clone());
  }
  write_safetensors(victim, tensors, f.metadata);
  // With the manifest's checksums the swap is found first (another test);
  // without them (an older manifest) the header check names the field.
  const Exit swapped = run_slipstream(tiny(dir.path(), {"dataset.path=" + data}));
  EXPECT_EQ(swapped.code, 1) << swapped.output;
  EXPECT_OUTPUT_HAS(swapped, "sample file '" + victim + "' is not the file manifest");
  drop_manifest_checksums(data);
  const Exit e = run_slipstream(tiny(dir.path(), {"dataset.path=" + data}));
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, victim);
  EXPECT_OUTPUT_HAS(e, "'pressure'");
  EXPECT_EQ(train_steps_logged(dir.path() + "/r"), 0u);
}

// --- resume continues the logs ----------------------------------------------

TEST(ReliabilityTest, AResumeAfterKillMinus9LogsEveryStepOnceAndContinuesTensorBoard) {
  testing::TempDir dir;
  const std::string run = dir.path() + "/r";
  ASSERT_EQ(run_slipstream(tiny(dir.path())).code, 0);  // epochs 1 and 2: steps 0..11
  {
    Process p(testing::slipstream_bin(), long_run(dir.path(), {"training.num_epochs=3"}));
    ASSERT_TRUE(eventually([&] { return train_steps_logged(run) >= 20; }, 30s)) << p.output();
    p.signal(SIGKILL);
    p.wait(10s);
  }
  // An extra partial line, as a kill during a write leaves.
  std::ofstream(run + "/metrics.jsonl", std::ios::app) << R"({"phase": "train_st)";
  const Exit e = run_slipstream(tiny(dir.path(), {"training.num_epochs=3"}));
  ASSERT_EQ(e.code, 0) << e.output;
  const auto steps = records(run + "/metrics.jsonl", "train_step");
  ASSERT_EQ(steps.size(), 18u);
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i]["global_step"], i);
  const auto configs = records(run + "/metrics.jsonl", "config");
  ASSERT_EQ(configs.size(), 3u);
  EXPECT_EQ(configs.back()["resume"]["global_step"], 12);
  EXPECT_EQ(records(run + "/metrics.jsonl", "train_summary").size(), 3u);
  EXPECT_EQ(records(run + "/metrics.jsonl", "val_step").size(), 6u);
  // Each start has its own event file, later-named; the resumed one starts a
  // session at the resumed step, train and val.
  std::vector<std::string> files;
  for (const auto& f : fs::directory_iterator(run + "/tb/val")) files.push_back(f.path());
  std::sort(files.begin(), files.end());
  ASSERT_EQ(files.size(), 3u);
  const auto last = read_event_file(files.back());
  ASSERT_GE(last.size(), 2u);
  EXPECT_TRUE(last[1].session_start);
  EXPECT_EQ(last[1].step, 4);  // val steps continue: 2 an epoch, 2 epochs before
  int per_step = 0;
  for (size_t i = 2; i < last.size(); ++i) {
    for (const auto& [tag, value] : last[i].scalars) {
      if (tag.rfind("iteration/", 0) != 0) continue;  // epoch summaries are at the epoch
      EXPECT_GE(last[i].step, 4) << tag;
      ++per_step;
    }
  }
  EXPECT_GT(per_step, 0);
}

TEST(ReliabilityTest, RandomKillsThenResumesGiveTheUninterruptedLossesBitwise) {
  testing::TempDir a, b;
  const std::vector<std::string> cfg = {"training.num_epochs=4", "training.steps_per_epoch=30"};
  ASSERT_EQ(run_slipstream(tiny(a.path(), cfg)).code, 0);
  const std::string run = b.path() + "/r";
  for (size_t kill_at : {7u, 45u, 80u}) {
    Process p(testing::slipstream_bin(), tiny(b.path(), cfg));
    eventually([&] { return train_steps_logged(run) >= kill_at; }, 30s);
    p.signal(SIGKILL);
    p.wait(10s);
  }
  ASSERT_EQ(run_slipstream(tiny(b.path(), cfg)).code, 0);
  const auto want = records(a.path() + "/r/metrics.jsonl", "train_step");
  const auto got = records(run + "/metrics.jsonl", "train_step");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i]["global_step"], want[i]["global_step"]);
    EXPECT_EQ(got[i]["loss"].get<double>(), want[i]["loss"].get<double>()) << "step " << i;
  }
}

// --- signals ------------------------------------------------------------------

TEST(ReliabilityTest, SigtermFinishesTheStepCheckpointsMidEpochExits143AndResumesBitwise) {
  testing::TempDir a, b;
  const std::vector<std::string> cfg = {"training.num_epochs=2", "training.steps_per_epoch=60"};
  ASSERT_EQ(run_slipstream(tiny(a.path(), cfg)).code, 0);
  const std::string run = b.path() + "/r";
  Process p(testing::slipstream_bin(), tiny(b.path(), cfg));
  ASSERT_TRUE(eventually([&] { return train_steps_logged(run) >= 70; }, 30s)) << p.output();
  p.signal(SIGTERM);
  const Exit stopped = p.wait(30s);
  EXPECT_EQ(stopped.code, 143) << stopped.output;
  EXPECT_OUTPUT_HAS(stopped, "stopped by Terminated");
  bool mid_epoch = false;
  for (const auto& [name, bytes] : snapshot(run + "/checkpoints")) {
    mid_epoch |= name.find("checkpoint_epoch_0001_step_") == 0;
  }
  EXPECT_TRUE(mid_epoch) << stopped.output;
  const Exit resumed = run_slipstream(tiny(b.path(), cfg));
  EXPECT_EQ(resumed.code, 0) << resumed.output;
  const auto want = records(a.path() + "/r/metrics.jsonl", "train_step");
  const auto got = records(run + "/metrics.jsonl", "train_step");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i]["loss"].get<double>(), want[i]["loss"].get<double>()) << "step " << i;
  }
  // The epoch summary covers the whole epoch, before and after the stop.
  const auto sa = records(a.path() + "/r/metrics.jsonl", "train_summary");
  const auto sb = records(run + "/metrics.jsonl", "train_summary");
  ASSERT_EQ(sb.size(), sa.size());
  EXPECT_EQ(sb.back()["loss"].get<double>(), sa.back()["loss"].get<double>());
}

TEST(ReliabilityTest, SigintStopsCleanlyWithExitCode130) {
  testing::TempDir dir;
  Process p(testing::slipstream_bin(), long_run(dir.path()));
  ASSERT_TRUE(eventually([&] { return train_steps_logged(dir.path() + "/r") >= 3; }, 30s));
  p.signal(SIGINT);
  const Exit e = p.wait(30s);
  EXPECT_EQ(e.code, 130) << e.output;
  EXPECT_FALSE(snapshot(dir.path() + "/r/checkpoints").empty());
}

TEST(ReliabilityTest, SighupFromAClosedTerminalStopsCleanlyWithACheckpointAndExit129) {
  testing::TempDir dir;
  Process p(testing::slipstream_bin(), long_run(dir.path()));
  ASSERT_TRUE(eventually([&] { return train_steps_logged(dir.path() + "/r") >= 3; }, 30s));
  p.signal(SIGHUP);
  const Exit e = p.wait(30s);
  EXPECT_EQ(e.code, 129) << e.output;
  EXPECT_OUTPUT_HAS(e, "SIGHUP (the terminal went away)");
  EXPECT_FALSE(snapshot(dir.path() + "/r/checkpoints").empty());
}

TEST(ReliabilityTest, TempFilesOfAWriterKilledMidWriteAreRemovedWhenTheRunStartsAgain) {
  testing::TempDir dir;
  ASSERT_EQ(run_slipstream(tiny(dir.path(), {"training.num_epochs=1"})).code, 0);
  // A pid that is no process: its writer is gone.
  pid_t dead = 0;
  {
    Process gone(testing::slipstream_bin(), {"--help"});
    gone.wait(10s);
    dead = gone.pid();
  }
  const std::string ckpt = dir.path() + "/r/checkpoints";
  const std::string stale = ckpt + "/checkpoint_epoch_0002.safetensors.tmp." + std::to_string(dead);
  const std::string live = ckpt + "/other.tmp." + std::to_string(getpid());
  std::ofstream(stale) << "half";
  std::ofstream(live) << "being written";
  const Exit e = run_slipstream(tiny(dir.path(), {"training.num_epochs=2"}));
  EXPECT_EQ(e.code, 0) << e.output;
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));  // its writer (this test) is alive
  EXPECT_OUTPUT_HAS(e, "left by a writer (pid " + std::to_string(dead) + ") that died mid-write");
}

TEST(ReliabilityTest, ASecondSignalExitsAtOnce) {
  testing::TempDir dir;
  Process p(testing::slipstream_bin(), long_run(dir.path()));
  ASSERT_TRUE(eventually([&] { return train_steps_logged(dir.path() + "/r") >= 3; }, 30s));
  p.signal(SIGTERM);
  // Two signals sent at once arrive as one: the second comes once the first is seen.
  ASSERT_TRUE(
      eventually([&] { return p.output().find("SIGTERM: finishing") != std::string::npos; }, 10s));
  p.signal(SIGTERM);
  const Exit e = p.wait(10s);
  EXPECT_EQ(e.code, 143) << e.output;
  EXPECT_OUTPUT_HAS(e, "second signal: exiting now");
}

TEST(ReliabilityTest, TheLauncherForwardsSigtermAndEveryRankCheckpointsAndExits143) {
  if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
  testing::TempDir dir;
  const std::string port = std::to_string(testing::free_port());
  auto args = long_run(dir.path());
  args.insert(args.begin(), {"launch", "--nproc", "2", "--port", port, "--"});
  Process launcher(testing::slipstream_bin(), args);
  ASSERT_TRUE(eventually([&] { return train_steps_logged(dir.path() + "/r") >= 3; }, 40s))
      << launcher.output();
  const auto ranks = testing::children_of(launcher.pid());
  EXPECT_EQ(ranks.size(), 2u);
  launcher.signal(SIGTERM);
  const Exit e = launcher.wait(40s);
  EXPECT_EQ(e.code, 143) << e.output;
  EXPECT_FALSE(snapshot(dir.path() + "/r/checkpoints").empty());
  for (pid_t r : ranks) EXPECT_FALSE(testing::alive(r)) << "rank pid " << r;
}

TEST(ReliabilityTest, KillingTheLauncherWithSigkillLeavesNoOrphanedRanks) {
  if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
  testing::TempDir dir;
  const std::string port = std::to_string(testing::free_port());
  auto args = long_run(dir.path());
  args.insert(args.begin(), {"launch", "--nproc", "2", "--port", port, "--"});
  Process launcher(testing::slipstream_bin(), args);
  ASSERT_TRUE(eventually([&] { return testing::children_of(launcher.pid()).size() == 2; }, 20s));
  const auto ranks = testing::children_of(launcher.pid());
  launcher.signal(SIGKILL);
  launcher.wait(10s);
  EXPECT_TRUE(eventually(
      [&] {
        for (pid_t r : ranks) {
          if (testing::alive(r)) return false;
        }
        return true;
      },
      10s));
}

// --- ranks -------------------------------------------------------------------

TEST(ReliabilityTest, ARankKilledMidRunIsNamedByTheLauncherAndTheOthers) {
  if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
  testing::TempDir dir;
  const std::string port = std::to_string(testing::free_port());
  auto args = long_run(dir.path(), {"distributed.timeout_s=10"});
  args.insert(args.begin(), {"launch", "--nproc", "2", "--port", port, "--"});
  Process launcher(testing::slipstream_bin(), args);
  ASSERT_TRUE(eventually([&] { return train_steps_logged(dir.path() + "/r") >= 3; }, 40s));
  pid_t rank1 = -1;
  for (pid_t r : testing::children_of(launcher.pid())) {
    if (contents("/proc/" + std::to_string(r) + "/environ").find(std::string("RANK=1") + '\0') !=
        std::string::npos) {
      rank1 = r;
    }
  }
  ASSERT_GT(rank1, 0);
  kill(rank1, SIGKILL);
  const Exit e = launcher.wait(40s);
  EXPECT_NE(e.code, 0);
  EXPECT_OUTPUT_HAS(e, "launch: rank 1 was killed by signal 9");
  EXPECT_EQ(e.output.find("is alive but"), std::string::npos) << e.output;  // it is dead
}

// A rank that fails with an error of its own (here a sample changed on
// disk) is the cause; its peer, waiting in a collective, is healthy.
TEST(ReliabilityTest, ARanksOwnErrorIsNamedAsTheCauseNotItsHealthyPeer) {
  if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
  testing::TempDir dir;
  const std::string data = make_small_dataset(dir.path());
  ASSERT_FALSE(HasFailure());
  poison_pressure_row_7(data + "/sample_00001.safetensors");
  const std::string port = std::to_string(testing::free_port());
  auto args = tiny(dir.path(),
                   {"dataset.path=" + data, "training.num_epochs=6", "distributed.timeout_s=30"});
  args.insert(args.begin(), {"launch", "--nproc", "2", "--port", port, "--"});
  const Exit e = run_slipstream(args, 90s);
  EXPECT_NE(e.code, 0) << e.output;
  EXPECT_OUTPUT_HAS(e, "row 7 is not finite");
  EXPECT_OUTPUT_HAS(e, "exited with 1; stopping the other ranks");
  for (const char* wrong : {"hung", "stopped responding", "caused the failure"}) {
    EXPECT_EQ(e.output.find(wrong), std::string::npos) << wrong << "\n" << e.output;
  }
}

TEST(ReliabilityTest, AHungRankIsBlamedInsteadOfTheHealthyRankThatTimedOut) {
  if (!has_gloo_backend()) GTEST_SKIP() << "no Gloo in this build";
  testing::TempDir dir;
  const std::string port = std::to_string(testing::free_port());
  auto args = long_run(dir.path(), {"distributed.timeout_s=4"});
  args.insert(args.begin(), {"launch", "--nproc", "2", "--port", port, "--"});
  Process launcher(testing::slipstream_bin(), args);
  ASSERT_TRUE(eventually([&] { return train_steps_logged(dir.path() + "/r") >= 3; }, 40s));
  for (pid_t r : testing::children_of(launcher.pid())) {
    if (contents("/proc/" + std::to_string(r) + "/environ").find(std::string("RANK=1") + '\0') !=
        std::string::npos) {
      kill(r, SIGSTOP);  // alive, but it never answers again
    }
  }
  const Exit e = launcher.wait(50s);
  EXPECT_NE(e.code, 0) << e.output;
  EXPECT_OUTPUT_HAS(e, "launch: rank 1 caused the failure");
  EXPECT_OUTPUT_HAS(e, "rank 1 stopped responding");
}

TEST(ReliabilityTest, AMissingPeerTimesOutOnceNamingTheRankAndTheAddress) {
  testing::TempDir dir;
  const std::string port = std::to_string(testing::free_port());
  const auto t0 = std::chrono::steady_clock::now();
  const Exit e =
      run_slipstream(tiny(dir.path(), {"distributed.timeout_s=3"}), 60s,
                     {"WORLD_SIZE=2", "RANK=0", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(
      e, "rank(s) 1 of 2 did not join the rendezvous at 127.0.0.1:" + port + " within 3 s");
  EXPECT_LT(seconds, 3 * 2 - 0.5) << "waited for the timeout twice";
}

// --- ownership of the run directory -------------------------------------------

TEST(ReliabilityTest, ARunIdThatLeavesTheOutputDirIsRejected) {
  testing::TempDir dir;
  const std::string out = dir.path() + "/runs";
  for (const std::string id : {"..", ".", "a/b", "../escape"}) {
    auto args = tiny(out);
    args.push_back("run_id=" + id);
    const Exit e = run_slipstream(args);
    EXPECT_EQ(e.code, 1) << id << ": " << e.output;
    EXPECT_OUTPUT_HAS(e, "must be a plain name");
  }
  EXPECT_FALSE(fs::exists(dir.path() + "/metrics.jsonl"));
  EXPECT_FALSE(fs::exists(dir.path() + "/escape"));
  // A newline or a tab would make a directory no shell names safely.
  for (const std::string id : {"a\nb", "tab\there"}) {
    auto args = tiny(out);
    args.push_back("run_id=" + id);
    const Exit e = run_slipstream(args);
    EXPECT_EQ(e.code, 1) << e.output;
    EXPECT_OUTPUT_HAS(e, "holds a control character");
  }
  EXPECT_FALSE(fs::exists(out));
}

TEST(ReliabilityTest, LaunchBoundsItsRanksByTheMachineNamingTheRange) {
  for (const std::string n : {"0", "100000"}) {
    const Exit e = run_slipstream({"launch", "--nproc", n, "--", "info"});
    EXPECT_EQ(e.code, 1) << n << ": " << e.output;
    EXPECT_OUTPUT_HAS(e, "--nproc " + n + " is not between 1 and ");
    EXPECT_LT(e.output.size(), 400u) << e.output;
  }
}

TEST(ReliabilityTest, ASecondRunWithTheSameRunIdIsRefusedNamingTheHoldersPid) {
  testing::TempDir dir;
  Process first(testing::slipstream_bin(), long_run(dir.path()));
  ASSERT_TRUE(eventually([&] { return train_steps_logged(dir.path() + "/r") >= 1; }, 30s));
  const Exit second = run_slipstream(tiny(dir.path()));
  EXPECT_EQ(second.code, 1) << second.output;
  EXPECT_OUTPUT_HAS(second, "in use by another run (pid " + std::to_string(first.pid()));
  EXPECT_TRUE(first.running());  // untouched by the refused one
}

// A tmpfs mounted at `path` (root only); false where mounting is not allowed.
bool mount_tmpfs(const std::string& path, const std::string& options) {
  fs::create_directories(path);
  return mount("tmpfs", path.c_str(), "tmpfs", 0, options.c_str()) == 0;
}

TEST(ReliabilityTest, AFullDiskUnderCheckpointsIsFoundBeforeTheFirstStep) {
  testing::TempDir dir;
  const std::string ckpt = dir.path() + "/r/checkpoints";
  if (!mount_tmpfs(ckpt, "size=4k")) GTEST_SKIP() << "cannot mount a tmpfs here";
  {
    std::ofstream fill(ckpt + "/fill", std::ios::binary);
    const std::string block(4096, 'x');
    for (int i = 0; i < 4 && fill; ++i) fill << block;
  }
  const Exit e = run_slipstream(tiny(dir.path()));
  umount(ckpt.c_str());
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, "found before the first step");
  EXPECT_OUTPUT_HAS(e, "No space left on device");
  EXPECT_EQ(train_steps_logged(dir.path() + "/r"), 0u);
}

TEST(ReliabilityTest, InferOnAFullDiskFailsAndLeavesNoTruncatedFileUnderItsName) {
  testing::TempDir dir;
  const std::string data = make_small_dataset(dir.path());
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(
      run_slipstream(tiny(dir.path(), {"dataset.path=" + data, "training.num_epochs=1"})).code, 0);
  // Room for the records, not for a 400-point .vtu (about 40 KB).
  const std::string out = dir.path() + "/pred";
  if (!mount_tmpfs(out, "size=12k")) GTEST_SKIP() << "cannot mount a tmpfs here";
  const Exit e = run_slipstream({"infer", "--checkpoint", dir.path() + "/r", "--split", "val",
                                 "--data", data, "--out", out, "--device", "cpu"});
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(out)) {
    left.push_back(entry.path().filename().string());
  }
  umount(out.c_str());
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, "No space left on device");
  for (const auto& name : left) {
    EXPECT_EQ(name.find(".vtu"), std::string::npos) << name;  // neither final nor temp
  }
}

TEST(ReliabilityTest, AReadOnlyOutputDirIsAClearErrorBeforeAnyWork) {
  testing::TempDir dir;
  const std::string out = dir.path() + "/ro";
  if (!mount_tmpfs(out, "size=64k")) GTEST_SKIP() << "cannot mount a tmpfs here";
  mount("tmpfs", out.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, "size=64k");
  const Exit e = run_slipstream(tiny(out));
  umount(out.c_str());
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, "Read-only file system");
}

// --- config ----------------------------------------------------------------------

TEST(ReliabilityTest, SizesBeyondTheMachineAreNamedByTheirKeysBeforeAnyWork) {
  testing::TempDir dir;
  const std::vector<std::string> cases = {"dataset.num_train=1000000000",
                                          "dataset.points_per_sample=10000000000",
                                          "model.n_layers=10000000"};
  for (const auto& override : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    const Exit e = run_slipstream(tiny(dir.path(), {override}));
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(e.code, 1) << override << ": " << e.output;
    EXPECT_OUTPUT_HAS(e, override);
    EXPECT_OUTPUT_HAS(e, "this machine has available");
    EXPECT_LT(took, 30s) << override;  // named before it grows, not after
  }
  EXPECT_EQ(train_steps_logged(dir.path() + "/r"), 0u);
}

TEST(ReliabilityTest, AKeyGivenTwiceInAYamlFileIsAnErrorNamingItAndItsLine) {
  testing::TempDir dir;
  const std::string configs = dir.path() + "/configs";
  fs::copy(std::string(SLIPSTREAM_SOURCE_DIR) + "/configs", configs, fs::copy_options::recursive);
  std::ofstream(configs + "/model/transolver_small.yaml", std::ios::app) << "n_hidden: 48\n";
  auto args = tiny(dir.path());
  args.insert(args.begin(), {"--config-dir", configs});
  const Exit e = run_slipstream(args);
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, configs + "/model/transolver_small.yaml' gives 'n_hidden' twice");
  EXPECT_FALSE(fs::exists(dir.path() + "/r"));
}

TEST(ReliabilityTest, AnUnknownKeyInsideAYamlFileIsAnErrorNamingTheKeyAndTheFile) {
  testing::TempDir dir;
  const std::string configs = dir.path() + "/configs";
  fs::copy(std::string(SLIPSTREAM_SOURCE_DIR) + "/configs", configs, fs::copy_options::recursive);
  std::ofstream(configs + "/train.yaml", std::ios::app) << "\nlogging_every: 3\n";
  {
    std::ofstream model(configs + "/model/transolver_small.yaml", std::ios::app);
    model << "n_hiden: 48\n";
  }
  auto args = tiny(dir.path());
  args.insert(args.begin(), {"--config-dir", configs});
  const Exit e = run_slipstream(args);
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, "'logging_every' in " + configs + "/train.yaml");
  EXPECT_OUTPUT_HAS(e, "'model.n_hiden' in " + configs + "/model/transolver_small.yaml");
  EXPECT_OUTPUT_HAS(e, "closest known key: 'model.n_hidden'");
  EXPECT_FALSE(fs::exists(dir.path() + "/r"));
}

TEST(ReliabilityTest, AnUnknownTargetFieldIsNamedAsSuch) {
  testing::TempDir dir;
  const Exit e = run_slipstream(
      tiny(dir.path(), {"dataset.targets={velocity: vector, vorticity: vector}",
                        "dataset.nondim={velocity: velocity}", "dataset.normalization={}"}));
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_OUTPUT_HAS(e, "target 'vorticity' (dataset.targets) is not a field of the samples");
  EXPECT_FALSE(fs::exists(dir.path() + "/r"));
}

}  // namespace
}  // namespace slipstream
