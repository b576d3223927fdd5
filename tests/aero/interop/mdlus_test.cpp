// PhysicsNeMo's .mdlus checkpoints: the fixtures PhysicsNeMo's own
// Module.save wrote load and reproduce PhysicsNeMo's outputs; what we write
// reads back to the same model; bad files are errors naming the file.
#include "aero/interop/mdlus.h"
#include "aero/model/geotransolver/geotransolver.h"
#include "aero/model/registry.h"
#include "aero/model/transolver/transolver.h"
#include "core/io/archive.h"
#include "core/io/safetensors.h"

#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <iterator>

namespace slipstream::aero {
namespace {

using testing::error_message_of;
using testing::relative_error;

std::string fixture(const std::string& name) { return testing::fixtures_dir() + "/" + name; }

torch::Tensor run(Model& model, const SafetensorsFile& io) {
  torch::NoGradGuard no_grad;
  ModelInputs inputs;
  for (const auto& [name, t] : io.tensors) {
    if (name.rfind("input.", 0) == 0) inputs[name.substr(6)] = t;
  }
  return model.forward(inputs);
}

TEST(MdlusTest, PhysicsNeMosTransolverCheckpointReproducesItsOutput) {
  const auto file = read_mdlus(fixture("transolver_small.mdlus"));
  EXPECT_EQ(file.class_name, "Transolver");
  EXPECT_EQ(file.metadata.at("mdlus_file_version"), "0.1.0");
  const auto model = build_from_mdlus(file);
  const auto io = read_safetensors(fixture("transolver_small_mdlus_io.safetensors"));
  EXPECT_LT(relative_error(run(*model, io), io.at("output")), 1e-5);
  // The arguments it was built from are the file's, key for key.
  EXPECT_TRUE(differing_args(model->physicsnemo_args(), file.args).empty());
}

TEST(MdlusTest, PhysicsNeMosGeoTransolverCheckpointReproducesItsOutput) {
  const auto file = read_mdlus(fixture("geotransolver_small_volume.mdlus"));
  EXPECT_EQ(file.class_name, "GeoTransolver");
  const auto model = build_from_mdlus(file);
  const auto io = read_safetensors(fixture("geotransolver_small_volume_mdlus_io.safetensors"));
  EXPECT_LT(relative_error(run(*model, io), io.at("output")), 1e-5);
  EXPECT_TRUE(differing_args(model->physicsnemo_args(), file.args).empty());
}

TEST(MdlusTest, WhatWeWriteReadsBackToTheSameModel) {
  testing::TempDir dir;
  const auto original = build_from_mdlus(read_mdlus(fixture("geotransolver_small_volume.mdlus")));
  write_mdlus(dir.path() + "/out.mdlus", *original);
  const auto back = read_mdlus(dir.path() + "/out.mdlus");
  EXPECT_EQ(back.class_name, "GeoTransolver");
  EXPECT_EQ(back.module, "physicsnemo.models.geotransolver.geotransolver");
  const auto rebuilt = build_from_mdlus(back);
  const auto io = read_safetensors(fixture("geotransolver_small_volume_mdlus_io.safetensors"));
  EXPECT_TRUE(torch::equal(run(*rebuilt, io), run(*original, io)));
}

TEST(MdlusTest, AnotherConfigOrClassOrABrokenFileIsAnErrorNamingIt) {
  testing::TempDir dir;
  const auto file = read_mdlus(fixture("transolver_small.mdlus"));
  TransolverOptions o;  // the recipe's volume defaults: 12 layers, width 256
  o.functional_dim = 3;
  o.embedding_dim = 7;
  Transolver other(o);
  auto msg = error_message_of([&] { load_mdlus_weights(*other, file); });
  EXPECT_NE(msg.find("n_layers: 12 vs 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("n_hidden: 256 vs 64"), std::string::npos) << msg;
  EXPECT_NE(msg.find("transolver_small.mdlus"), std::string::npos) << msg;

  auto unknown = file;
  unknown.class_name = "FNO";
  msg = error_message_of([&] { build_from_mdlus(unknown); });
  EXPECT_NE(msg.find("'FNO' is not one Slipstream builds"), std::string::npos) << msg;

  auto dropout = file;
  dropout.args["dropout"] = 0.1;
  msg = error_message_of([&] { build_from_mdlus(dropout); });
  EXPECT_NE(msg.find("'dropout' is 0.1"), std::string::npos) << msg;

  std::ifstream in(fixture("transolver_small.mdlus"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const std::string cut = dir.path() + "/cut.mdlus";
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  msg = error_message_of([&] { read_mdlus(cut); });
  EXPECT_NE(msg.find("cut.mdlus"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;

  const std::string no_model = dir.path() + "/no_model.mdlus";
  std::ofstream(no_model, std::ios::binary) << write_zip({{"args.json", "{}"}});
  msg = error_message_of([&] { read_mdlus(no_model); });
  EXPECT_NE(msg.find("no 'model.pt'"), std::string::npos) << msg;

  // Without metadata.json (as older PhysicsNeMo wrote) the file reads, with
  // empty metadata; args.json of the wrong types is an error naming it.
  auto entries = read_archive(bytes, "transolver_small.mdlus");
  ASSERT_EQ(entries.erase("metadata.json"), 1u);
  const std::string no_metadata = dir.path() + "/no_metadata.mdlus";
  std::ofstream(no_metadata, std::ios::binary) << write_zip({entries.begin(), entries.end()});
  const auto read = read_mdlus(no_metadata);
  EXPECT_TRUE(read.metadata.is_object() && read.metadata.empty()) << read.metadata.dump();
  EXPECT_EQ(read.class_name, "Transolver");
  entries["args.json"] = R"({"__name__": 3, "__module__": "m", "__args__": {}})";
  const std::string bad_args = dir.path() + "/bad_args.mdlus";
  std::ofstream(bad_args, std::ios::binary) << write_zip({entries.begin(), entries.end()});
  msg = error_message_of([&] { read_mdlus(bad_args); });
  EXPECT_NE(msg.find("args.json's '__name__' is not a string"), std::string::npos) << msg;
}

}  // namespace
}  // namespace slipstream::aero
