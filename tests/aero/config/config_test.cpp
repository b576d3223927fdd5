#include "aero/config/config.h"
#include "aero/model/memory_estimate.h"
#include "aero/ops/numerics_settings.h"
#include "aero/train/run.h"

#include "support/test_support.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace slipstream::aero {
namespace {

const std::string kDir = std::string(SLIPSTREAM_SOURCE_DIR) + "/configs";

// The error of resolving a config as far as building its model, or "".
std::string error_of(const std::vector<std::string>& overrides) {
  try {
    const auto c = Config::load(kDir, overrides);
    const auto spec = resolve_run_spec(c);
    build_model(c, model_shape(spec, synthetic_layout()));
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

TEST(ConfigTest, DefaultsResolve) {
  const auto c = Config::load(kDir, {});
  const auto s = resolve_settings(c);
  EXPECT_EQ(c.get<std::string>("defaults.model"), "transolver_small");
  EXPECT_EQ(c.get<int64_t>("model.n_hidden"), 64);
  EXPECT_EQ(s.readback, ReadbackPolicy::kAsync);
  EXPECT_EQ(resolve_fields(c).names(), (std::vector<std::string>{"velocity", "pressure", "nut"}));
  EXPECT_EQ(error_of({}), "");
}

TEST(ConfigTest, OverridesPickGroupFilesAndSetKeys) {
  const auto c = Config::load(kDir, {"model=transolver_volume", "model.n_layers=3",
                                     "training.num_epochs=2", "run_id=x", "optimizer.lr=0.01"});
  const auto s = resolve_settings(c);
  EXPECT_EQ(c.get<int64_t>("model.n_hidden"), 256);
  EXPECT_EQ(c.get<int64_t>("model.n_layers"), 3);
  EXPECT_EQ(s.num_epochs, 2);
  EXPECT_EQ(s.run_id, "x");
  EXPECT_DOUBLE_EQ(s.optimizer.lr, 0.01);
  EXPECT_NE(c.to_yaml().find("n_layers: 3"), std::string::npos);
}

TEST(ConfigTest, UnknownKeyNamesTheClosestValidKey) {
  const auto msg = error_of({"training.num_epoch=3"});
  EXPECT_NE(msg.find("'training.num_epoch'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'training.num_epochs'"), std::string::npos) << msg;
}

TEST(ConfigTest, AnUnknownKeyWhoseLastPartExistsElsewhereNamesThatKey) {
  const auto msg = error_of({"training.lr=0.1"});
  EXPECT_NE(msg.find("'optimizer.lr'"), std::string::npos) << msg;
}

TEST(ConfigTest, AKeyRenamedInAYamlFileIsNamedWithTheFileAndTheNewName) {
  testing::TempDir dir;
  std::filesystem::copy(kDir, dir.path(), std::filesystem::copy_options::recursive);
  const std::string train = dir.path() + "/train.yaml";
  std::string text;
  for (const auto& line : testing::read_lines(train)) {
    text += (line.rfind("  num_epochs:", 0) == 0 ? "  epochs:" + line.substr(13) : line) + "\n";
  }
  std::ofstream(train, std::ios::trunc) << text;
  const auto msg =
      testing::error_message_of([&] { resolve_settings(Config::load(dir.path(), {})); });
  EXPECT_NE(msg.find("missing key 'training.num_epochs' in " + train), std::string::npos) << msg;
  EXPECT_NE(msg.find("'training.epochs': renamed?"), std::string::npos) << msg;
}

TEST(ConfigTest, BadValuesNameTheKey) {
  EXPECT_NE(error_of({"training.resume=maybe"}).find("auto, true, false"), std::string::npos);
  EXPECT_NE(error_of({"training.num_epochs=two"}).find("training.num_epochs"), std::string::npos);
  EXPECT_NE(error_of({"training.num_epochs=0"}).find("training.num_epochs"), std::string::npos);
  EXPECT_NE(error_of({"loss.type=l3"}).find("loss.type"), std::string::npos);
  EXPECT_NE(error_of({"training.readback=sometimes"}).find("sometimes"), std::string::npos);
  const auto model = error_of({"model=transolver_volum"});
  EXPECT_NE(model.find("transolver_volume"), std::string::npos) << model;
  EXPECT_NE(error_of({"novalue"}).find("key=value"), std::string::npos);
  EXPECT_NE(error_of({"model.n_head=7"}).find("divisible"), std::string::npos);
  EXPECT_NE(error_of({"model.name=flare"}).find("transolver"), std::string::npos);
  // The force loss: a volume has no surface to integrate; names are checked.
  EXPECT_NE(error_of({"loss.forces.weight=1"}).find("dataset.kind is volume"), std::string::npos);
  EXPECT_NE(error_of({"loss.forces.weight=-1"}).find("loss.forces.weight"), std::string::npos);
  EXPECT_NE(error_of({"dataset=ahmed_surface", "loss.forces.weight=1",
                      "loss.forces.coefficients=[CD, CX]"})
                .find("'CX' is not one of CD, CL, CS"),
            std::string::npos);
  EXPECT_NE(error_of({"dataset=ahmed_surface", "loss.forces.weight=1", "loss.forces.scale=0"})
                .find("loss.forces.scale"),
            std::string::npos);
  // The inputs must be the ones the model family reads.
  const auto inputs = error_of({"model.inputs={embedding: [points, sdf]}"});
  EXPECT_NE(inputs.find("embedding, fx"), std::string::npos) << inputs;
  // A target the samples do not hold is named as such.
  const auto target = error_of({"dataset.targets={velocity: vector, wss: vector}",
                                "dataset.nondim={velocity: velocity}", "dataset.normalization={}"});
  EXPECT_NE(target.find("target 'wss'"), std::string::npos) << target;
}

// numerics: read with the rest of the config, each value checked naming the
// key and the choices, and carried by the config itself (the config
// record's params, a checkpoint's config, the ranks' check) and by the
// "numerics" record of the logs and the bench JSON.
TEST(ConfigTest, TheNumericsBlockIsCheckedAndRecorded) {
  EXPECT_EQ(
      to_json(numerics_settings(Config::load(kDir, {}))),
      (nlohmann::json{{"gemm", "tuned"},
                      {"gemm_report", false},
                      {"slice_kernels", "auto"},
                      {"slice_weight_grad", "gemm"},
                      {"parameter_casts", "once"},
                      {"fp8_amax_history", 16},
                      {"fp8_margin", 0},
                      {"fp8_exclude", nlohmann::json::array({"embedding", "attention_inputs"})}}));
  for (const auto& [key, choices] : std::vector<std::pair<std::string, std::string>>{
           {"numerics.gemm", "tuned, heuristic, aten"},
           {"numerics.slice_kernels", "auto, mma"},
           {"numerics.slice_weight_grad", "gemm, kernel"},
           {"numerics.parameter_casts", "once, per_use"}}) {
    const auto msg = error_of({key + "=fast"});
    EXPECT_NE(msg.find("'" + key + "' is 'fast', expected one of: " + choices), std::string::npos)
        << msg;
  }
  EXPECT_NE(error_of({"numerics.gemm_report=sometimes"}).find("numerics.gemm_report"),
            std::string::npos);
  EXPECT_NE(error_of({"numerics.fp8_amax_history=0"})
                .find("'numerics.fp8_amax_history' is 0, expected 1 to 1024 steps"),
            std::string::npos);
  EXPECT_NE(
      error_of({"numerics.fp8_margin=-1"}).find("'numerics.fp8_margin' is -1, expected 0 to 16"),
      std::string::npos);
  EXPECT_NE(error_of({"numerics.fp8_exclude=[embedding,head]"})
                .find("'numerics.fp8_exclude' has 'head'; its entries are embedding and "
                      "attention_inputs"),
            std::string::npos);
  EXPECT_EQ(to_json(numerics_settings(
                        Config::load(kDir, {"numerics.fp8_exclude=[attention_inputs,embedding]"})))
                .at("fp8_exclude"),
            (nlohmann::json{"attention_inputs", "embedding"}));
  EXPECT_NE(error_of({"precision=fp16"}).find("auto, fp32, bf16, fp8"), std::string::npos);
  const auto c = Config::load(kDir, {"numerics.slice_kernels=mma", "numerics.gemm=aten"});
  EXPECT_EQ(c.flat().at("numerics.slice_kernels"), "mma");
  EXPECT_NE(c.to_yaml().find("slice_kernels: mma"), std::string::npos);
  const auto model = build_model(c, model_shape(resolve_run_spec(c), synthetic_layout()));
  const auto record = numerics_record(*model, c10::Device(c10::kCPU), false, c);
  EXPECT_EQ(record.at("slice_kernels"), "mma");
  EXPECT_EQ(record.at("gemm"), "aten");
  EXPECT_TRUE(record.contains("layer_norm")) << record.dump();  // the model's own paths too
}

// The estimate against what was measured: one H200's peak for the volume
// Transolver (200k points, bf16, fused kernels: 18.4 GiB), and this CPU's
// peak resident set growing by 2.59 GiB from 10k to 40k points at 2 layers
// (fp32, plain path).
TEST(ConfigTest, TheMemoryEstimateIsNearWhatWasMeasured) {
  const auto gpu = Config::load(kDir, {"model=transolver_volume"});
  const auto g = estimate_training_memory(gpu, 8964709, 200000, /*bf16=*/true, /*fused=*/true, {});
  ASSERT_TRUE(g.has_value());
  const double gib = 1024.0 * 1024.0 * 1024.0;
  EXPECT_NEAR(g->total() / gib, 18.4, 0.1 * 18.4);
  const auto cpu = Config::load(kDir, {"model=transolver_volume", "model.n_layers=2"});
  const auto at = [&](int64_t points) {
    return estimate_training_memory(cpu, 1500000, points, false, false, {})->total() / gib;
  };
  EXPECT_NEAR(at(40000) - at(10000), 2.59, 0.15 * 2.59);
  // Recompute keeps less; another family is not estimated.
  RecomputeOptions block{Recompute::kBlock, 0};
  EXPECT_LT(
      estimate_training_memory(cpu, 1500000, 40000, false, false, block)->activation_bytes,
      0.6 * estimate_training_memory(cpu, 1500000, 40000, false, false, {})->activation_bytes);
}

TEST(ConfigTest, EditDistance) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("same", "same"), 0u);
}

}  // namespace
}  // namespace slipstream::aero
