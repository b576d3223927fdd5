// A run is assembled once: the precision is decided in one place and
// followed by training, the checkpoint, inference and bench; the model's
// widths come from the input spec and the targets; load_trained rebuilds
// what inference needs from the checkpoint alone.
#include "aero/train/run.h"
#include "aero/infer/trained_model.h"
#include "aero/interop/mdlus.h"
#include "aero/model/registry.h"
#include "aero/ops/fp8_linear.h"
#include "aero/ops/numerics_settings.h"
#include "aero/ops/parameter_casts.h"
#include "aero/run/checkpoint.h"
#include "aero/train/run_checkpoints.h"
#include "aero/train/trainer.h"
#include "core/device/device.h"
#include "core/io/safetensors.h"
#include "support/recipe_support.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>

namespace slipstream::aero {
namespace {

using testing::error_message_of;

std::vector<std::string> tiny(const std::string& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"model.n_layers=1",
                                "model.n_hidden=32",
                                "model.n_head=2",
                                "model.slice_num=8",
                                "dataset.num_train=2",
                                "dataset.num_val=1",
                                "dataset.points_per_sample=300",
                                "dataset.sampling_resolution=128",
                                "training.num_epochs=1",
                                "output_dir=" + out,
                                "run_id=r",
                                "logging.console_every_n_steps=100"};
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

TEST(RunTest, PrecisionIsDecidedOnceFromTheSettingAndTheDevice) {
  const c10::Device cuda(c10::kCUDA, 0), cpu(c10::kCPU);
  EXPECT_EQ(decide_precision("auto", cuda), Precision::kBf16);
  EXPECT_EQ(decide_precision("auto", cpu), Precision::kFp32);
  EXPECT_EQ(decide_precision("fp32", cuda), Precision::kFp32);
  EXPECT_EQ(decide_precision("bf16", cuda), Precision::kBf16);
  EXPECT_NE(error_message_of([&] { decide_precision("bf16", cpu); }).find("CUDA"),
            std::string::npos);
  // Inference follows the trained precision where the device can run it.
  EXPECT_EQ(inference_precision(Precision::kFp32, cuda), Precision::kFp32);
  EXPECT_EQ(inference_precision(Precision::kBf16, cuda), Precision::kBf16);
  EXPECT_EQ(inference_precision(Precision::kBf16, cpu), Precision::kFp32);
  // fp8 needs the fp8 GEMMs on a GPU that has them: elsewhere it is refused
  // naming why, and an fp8-trained model is inferred in fp32 on a CPU and in
  // bf16 on a GPU without them.
  EXPECT_EQ(parse_precision("fp8"), Precision::kFp8);
  EXPECT_EQ(to_string(Precision::kFp8), "fp8");
  const auto on_cpu = error_message_of([&] { decide_precision("fp8", cpu); });
  EXPECT_NE(on_cpu.find("precision 'fp8' cannot run here: fp8 GEMMs need a CUDA GPU; this run is "
                        "on cpu; use precision=bf16"),
            std::string::npos)
      << on_cpu;
  const bool gpu_fp8 = fp8::unsupported(cuda).empty();
  if (gpu_fp8) {
    EXPECT_EQ(decide_precision("fp8", cuda), Precision::kFp8);
  } else {
    EXPECT_NE(error_message_of([&] {
                decide_precision("fp8", cuda);
              }).find("precision 'fp8' cannot run here: " + fp8::unsupported(cuda)),
              std::string::npos);
  }
  EXPECT_EQ(inference_precision(Precision::kFp8, cpu), Precision::kFp32);
  EXPECT_EQ(inference_precision(Precision::kFp8, cuda),
            gpu_fp8 ? Precision::kFp8 : Precision::kBf16);
}

// A run configured for fp8 where it cannot run stops before anything
// starts, naming the setting and the reason, not falling back silently.
TEST(RunTest, Fp8IsRefusedWhereItCannotRun) {
  testing::TempDir dir;
  const auto msg = error_message_of([&] {
    build_run(testing::load_config(tiny(dir.path(), {"device=cpu", "precision=fp8"})),
              DistributedEnv{});
  });
  EXPECT_NE(msg.find("config: precision 'fp8' cannot run here"), std::string::npos) << msg;
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/r")) << "nothing was written";
  EXPECT_FALSE(fp8::enabled());
}

// The in-memory dataset has splits train and val: another name is refused
// rather than ignored, and val_split=null validates on nothing.
TEST(RunTest, TheSyntheticDatasetsSplitsAreTrainAndVal) {
  testing::TempDir dir;
  const auto open = [&](const std::string& val) {
    return open_datasets(resolve_run_spec(testing::load_config(tiny(dir.path(), {val}))));
  };
  EXPECT_EQ(open("val_split=val").val->size(), 1u);
  EXPECT_EQ(open("val_split=null").val->size(), 0u);
  const auto msg = error_message_of([&] { open("val_split=test"); });
  EXPECT_NE(msg.find("splits train and val"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'test'"), std::string::npos) << msg;
}

// model.init_from: the run starts from a PhysicsNeMo .mdlus's weights, and
// export writes a .mdlus that reads back to the trained weights.
TEST(RunTest, InitFromAMdlusStartsFromItsWeightsAndExportRoundTrips) {
  testing::TempDir dir;
  const std::string mdlus = testing::fixtures_dir() + "/transolver_small.mdlus";
  const std::vector<std::string> same = {"model.n_layers=2", "model.n_hidden=64",
                                         "model.n_head=4",   "model.slice_num=16",
                                         "device=cpu",       "model.init_from=" + mdlus};
  auto run = build_run(testing::load_config(tiny(dir.path(), same)), DistributedEnv{});
  const auto file = read_mdlus(mdlus);
  std::map<std::string, torch::Tensor> want(file.state.begin(), file.state.end());
  for (const auto& p : run->model->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value().detach(), want.at(p.key()))) << p.key();
  }
  // Another config: an error listing the differences, before any work.
  auto other = same;
  other[0] = "model.n_layers=1";
  const auto msg = error_message_of(
      [&] { build_run(testing::load_config(tiny(dir.path(), other)), DistributedEnv{}); });
  EXPECT_NE(msg.find("n_layers: 1 vs 2"), std::string::npos) << msg;
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/r/checkpoints"));
  // Train one epoch, export, read back: the checkpoint's weights, by name.
  Trainer(*run).fit();
  const auto trained = load_trained(dir.path() + "/r", c10::Device(c10::kCPU));
  write_mdlus(dir.path() + "/out.mdlus", *trained.model);
  const auto back = read_mdlus(dir.path() + "/out.mdlus");
  std::map<std::string, torch::Tensor> got(back.state.begin(), back.state.end());
  int64_t changed = 0;
  for (const auto& p : trained.model->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value().detach(), got.at(p.key()))) << p.key();
    changed += !torch::equal(got.at(p.key()), want.at(p.key()));
  }
  EXPECT_GT(changed, 0);  // it trained from there
  EXPECT_TRUE(differing_args(back.args, file.args).empty());
}

TEST(RunTest, ModelWidthsComeFromTheInputSpecAndTheTargets) {
  testing::TempDir dir;
  auto run = build_run(testing::load_config(tiny(dir.path(), {"device=cpu"})), DistributedEnv{});
  EXPECT_EQ(run->shape.input_widths, (std::map<std::string, int64_t>{{"embedding", 7}, {"fx", 3}}));
  EXPECT_EQ(run->shape.out_dim, 5);
  EXPECT_EQ(run->precision, Precision::kFp32);
  EXPECT_EQ(run->loader.inputs.names(), (std::vector<std::string>{"embedding", "fx"}));
  // Another input layout and another target set: a different model, no code change.
  auto other =
      build_run(testing::load_config(
                    tiny(dir.path(), {"device=cpu", "model.inputs.embedding=[points, sdf_normals]",
                                      "dataset.targets={pressure: scalar}", "dataset.nondim={}",
                                      "dataset.normalization={}"})),
                DistributedEnv{});
  EXPECT_EQ(other->shape.input_widths.at("embedding"), 6);
  EXPECT_EQ(other->shape.out_dim, 1);
  Batch b = make_host_batch(other->data.train->get(0), other->loader, 1);
  EXPECT_EQ(other->model->forward(b.inputs).sizes(), (std::vector<int64_t>{1, 128, 1}));
}

TEST(RunTest, TheCheckpointRecordsThePrecisionAndInferenceFollowsIt) {
  testing::TempDir dir;
  auto run =
      build_run(testing::load_config(tiny(dir.path(), {"precision=fp32"})), DistributedEnv{});
  Trainer(*run).fit();
  const std::string ckpt = dir.path() + "/r/checkpoints";
  const auto info = load_newest_checkpoint(ckpt, nullptr, nullptr);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->metadata.at("precision"), "fp32");
  const TrainedModel fp32 = load_trained(ckpt, c10::Device(c10::kCPU));
  EXPECT_EQ(fp32.trained_precision, Precision::kFp32);
  EXPECT_EQ(fp32.precision, Precision::kFp32);
  EXPECT_EQ(fp32.fields, run->spec.fields);
  // Same weights as the run that saved them.
  for (const auto& p : run->model->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value().cpu(), fp32.model->named_parameters()[p.key()].cpu()))
        << p.key();
  }
  // A checkpoint trained in bf16 says so; a CPU runs it in fp32 and says that.
  auto meta = run->checkpoint_metadata();
  meta["precision"] = "bf16";
  save_checkpoint(ckpt, TrainPosition{7, 0, 99, 0, nullptr}, *run->model, *run->optimizer, meta);
  const TrainedModel bf16 = load_trained(ckpt, c10::Device(c10::kCPU));
  EXPECT_EQ(bf16.checkpoint.position.epochs_done, 7);
  EXPECT_EQ(bf16.trained_precision, Precision::kBf16);
  EXPECT_EQ(bf16.precision, Precision::kFp32);
  // Inference: every point, in physical units, the fields' channel layout.
  const Sample s = run->data.val->get(0);
  const auto pred = fp32.predict(s, 100);
  EXPECT_EQ(pred.sizes(), (std::vector<int64_t>{300, 5}));
  EXPECT_TRUE(torch::isfinite(pred).all().item<bool>());
}

// The header is under a checksum as the tensors are: a changed digit in the
// run's position is damage, not an extra epoch; a tensor the header lists
// but the file lacks is damage, not another config; a file of the format
// before the header checksum still loads.
TEST(RunTest, TheCheckpointHeaderIsUnderItsChecksumAndAMissingTensorIsDamage) {
  testing::TempDir dir;
  auto run =
      build_run(testing::load_config(tiny(dir.path(), {"precision=fp32"})), DistributedEnv{});
  const std::string ckpt_dir = dir.path() + "/ckpt";
  const std::string path =
      save_checkpoint(ckpt_dir, TrainPosition{7, 0, 99, 0, nullptr}, *run->model, *run->optimizer,
                      run->checkpoint_metadata());
  ASSERT_EQ(load_checkpoint(path, run->model.get(), run->optimizer.get()).position.epochs_done, 7);
  const auto read_bytes = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const auto write_bytes = [](const std::string& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
  };
  const std::string good = read_bytes(path);
  // One digit of the header changed in place: epoch 7 becomes 8.
  std::string bad = good;
  const auto at = bad.find("\"epoch\":\"7\"");
  ASSERT_NE(at, std::string::npos);
  bad[at + 9] = '8';
  write_bytes(path, bad);
  try {
    load_checkpoint(path, run->model.get(), run->optimizer.get());
    ADD_FAILURE() << "a changed header loaded";
  } catch (const CheckpointDamaged& e) {
    EXPECT_NE(std::string(e.what()).find("its header"), std::string::npos) << e.what();
  }
  // The same header over a file without one optimizer tensor.
  write_bytes(path, good);
  SafetensorsFile f = read_safetensors(path);
  std::vector<std::pair<std::string, at::Tensor>> kept;
  std::string dropped;
  for (const auto& [name, t] : f.tensors) {
    if (dropped.empty() && name.rfind("optim.", 0) == 0) {
      dropped = name;
      continue;
    }
    kept.emplace_back(name, t.clone());
  }
  ASSERT_FALSE(dropped.empty());
  const auto metadata = f.metadata;
  f = SafetensorsFile{};
  write_safetensors(path, kept, metadata);
  try {
    load_checkpoint(path, run->model.get(), run->optimizer.get());
    ADD_FAILURE() << "a checkpoint without '" << dropped << "' loaded";
  } catch (const CheckpointDamaged& e) {
    EXPECT_NE(std::string(e.what()).find("'" + dropped + "' was written but is missing"),
              std::string::npos)
        << e.what();
  }
  // The format before the header checksum: tensors checked, header trusted.
  write_bytes(path, good);
  f = read_safetensors(path);
  std::vector<std::pair<std::string, at::Tensor>> all;
  for (const auto& [name, t] : f.tensors) all.emplace_back(name, t.clone());
  auto v2 = f.metadata;
  v2.erase("header_checksum");
  v2["format"] = "slipstream-checkpoint-v2";
  f = SafetensorsFile{};
  write_safetensors(path, all, v2);
  EXPECT_EQ(load_checkpoint(path, run->model.get(), run->optimizer.get()).position.epochs_done, 7);
}

// A resume checks what the weights mean, not only their shapes: another
// normalisation or another centring is refused, naming it, before the run
// writes anything; a change of schedule resumes. Inference reads the
// checkpoint's own config, whatever the run directory's copy says since.
TEST(RunTest, AResumeOfAnotherMeaningIsRefusedAndInferenceReadsTheCheckpointsOwnConfig) {
  testing::TempDir dir;
  auto first =
      build_run(testing::load_config(tiny(dir.path(), {"precision=fp32"})), DistributedEnv{});
  Trainer(*first).fit();
  const std::string resolved = dir.path() + "/r/resolved_config.yaml";
  const auto read_text = [](const std::string& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string written = read_text(resolved);
  struct Case {
    const char* override_;
    const char* named;
  };
  for (const auto& c : {Case{"dataset.normalization.pressure.std=0.5", "the target fields"},
                        Case{"dataset.transforms.center=true", "the sample transforms"}}) {
    auto run = build_run(testing::load_config(tiny(
                             dir.path(), {"precision=fp32", "training.num_epochs=2", c.override_})),
                         DistributedEnv{});
    const auto msg = testing::error_message_of([&] { Trainer(*run).fit(); });
    EXPECT_NE(msg.find("another meaning"), std::string::npos) << c.override_ << ": " << msg;
    EXPECT_NE(msg.find(c.named), std::string::npos) << c.override_ << ": " << msg;
    EXPECT_EQ(read_text(resolved), written) << c.override_;
  }
  auto longer =
      build_run(testing::load_config(tiny(dir.path(), {"precision=fp32", "training.num_epochs=2"})),
                DistributedEnv{});
  const TrainResult resumed = Trainer(*longer).fit();
  EXPECT_EQ(resumed.start_epoch, 1);
  EXPECT_EQ(resumed.train.size(), 1u);
  // The run directory's copy rewritten as another run would: inference
  // still has the checkpoint's fields and statistics.
  std::ofstream(resolved, std::ios::trunc) << "dataset: {normalization: {pressure: {std: 9}}}\n";
  const TrainedModel t = load_trained(dir.path() + "/r", c10::Device(c10::kCPU));
  EXPECT_EQ(t.fields, first->spec.fields);
  EXPECT_EQ(t.spec.fields, first->spec.fields);
}

// Inference runs with the numerics its checkpoint's run was trained with,
// whatever an earlier run in the process left, and knows its samples'
// domain from the run's dataset.
TEST(RunTest, InferenceTakesTheNumericsAndTheSampleDomainOfItsCheckpoint) {
  testing::TempDir dir;
  auto run = build_run(testing::load_config(tiny(dir.path(), {"numerics.parameter_casts=per_use"})),
                       DistributedEnv{});
  Trainer(*run).fit();
  apply_numerics(NumericsSettings{}, false);  // as another run would leave them
  ASSERT_TRUE(ParameterCasts::enabled());
  const TrainedModel t = load_trained(dir.path() + "/r", c10::Device(c10::kCPU));
  EXPECT_FALSE(ParameterCasts::enabled());
  EXPECT_EQ(t.domain, SampleDomain::kVolume);
  apply_numerics(NumericsSettings{}, false);
}

// training.keep_best: the checkpoint of the lowest val loss outlives
// keep_last's pruning, under a name a resume never takes for the newest,
// and its header says which epoch and loss it holds.
TEST(RunTest, TheBestCheckpointIsKeptWhenKeepLastWouldPruneIt) {
  testing::TempDir dir;
  auto run =
      build_run(testing::load_config(tiny(dir.path(), {"precision=fp32"})), DistributedEnv{});
  const std::string ckpt = dir.path() + "/r/checkpoints";
  std::filesystem::create_directories(ckpt);
  const std::vector<std::optional<double>> losses = {0.5,          0.3,  0.4,
                                                     std::nullopt, 0.45, std::nan("")};
  std::map<int64_t, torch::Tensor> weights;  // the first parameter at each epoch
  for (int64_t e = 1; e <= 6; ++e) {
    {
      torch::NoGradGuard no_grad;
      run->model->parameters().front().add_(0.25);
    }
    weights[e] = run->model->parameters().front().detach().clone();
    save_run_checkpoint(*run, {e, 0, 2 * e, e, nullptr}, losses[static_cast<size_t>(e - 1)]);
  }
  const auto kept = list_checkpoints(ckpt);
  ASSERT_EQ(kept.size(), 3u);  // keep_last's default: epochs 6, 5, 4
  EXPECT_NE(kept.back().find("epoch_0004"), std::string::npos);
  const auto best = best_checkpoint(ckpt);
  ASSERT_TRUE(best.has_value());
  EXPECT_EQ(best->epoch, 2);
  EXPECT_EQ(best->val_loss, 0.3);
  EXPECT_EQ(best->path, ckpt + "/best.safetensors");
  // It is epoch 2's model, whole: it loads and holds epoch 2's weights.
  auto model = build_initial_model(run->config, run->shape, 99);
  const CheckpointInfo info = load_checkpoint(best->path, model.get(), nullptr);
  EXPECT_EQ(info.position.epochs_done, 2);
  EXPECT_TRUE(torch::equal(model->parameters().front(), weights[2]));
  // A resume takes the newest regular checkpoint, not the best.
  EXPECT_NE(load_newest_checkpoint(ckpt, nullptr, nullptr)->path.find("epoch_0006"),
            std::string::npos);

  // training.keep_best=false keeps none.
  testing::TempDir other;
  auto plain = build_run(testing::load_config(tiny(other.path(), {"training.keep_best=false"})),
                         DistributedEnv{});
  std::filesystem::create_directories(other.path() + "/r/checkpoints");
  save_run_checkpoint(*plain, {1, 0, 2, 1, nullptr}, 0.1);
  EXPECT_FALSE(best_checkpoint(other.path() + "/r/checkpoints").has_value());
  EXPECT_FALSE(std::filesystem::exists(other.path() + "/r/checkpoints/best.safetensors"));
}

TEST(RunTest, BenchReportsThePrecisionTheRunDecided) {
  testing::TempDir dir;
  const char* bin = std::getenv("SLIPSTREAM_BIN");
  ASSERT_NE(bin, nullptr);
  std::string cmd = std::string(bin) + " bench --rounds 1 --steps 1 --warmup 0 --policies async" +
                    " model=transolver_small dataset=synthetic precision=fp32";
  for (const auto& o : tiny(dir.path())) cmd += " " + o;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
  const int status = pclose(p);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  const auto line = out.substr(out.find("{\"bench\""));
  const auto j = nlohmann::json::parse(line.substr(0, line.find('\n')));
  EXPECT_EQ(j["precision"], "fp32") << out;
  EXPECT_EQ(j["numerics"]["layer_norm"], "fp32") << out;
}

// On a GPU: fp32 configured means fp32 in training, in the checkpoint and
// in inference; auto means bf16 in all three.
TEST(RunTest, ConfiguredPrecisionHoldsOnTheGpu_CUDA) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& [setting, want] :
       {std::pair{"fp32", Precision::kFp32}, std::pair{"auto", Precision::kBf16}}) {
    testing::TempDir dir;
    auto run = build_run(testing::load_config(tiny(
                             dir.path(), {"device=cuda", std::string("precision=") + setting})),
                         DistributedEnv{});
    EXPECT_EQ(run->precision, want) << setting;
    EXPECT_EQ(run->config_record()["precision"], to_string(want)) << setting;
    Trainer(*run).fit();
    const auto trained = load_trained(dir.path() + "/r/checkpoints", run->device);
    EXPECT_EQ(trained.trained_precision, want) << setting;
    EXPECT_EQ(trained.precision, want) << setting;
  }
}

}  // namespace
}  // namespace slipstream::aero
