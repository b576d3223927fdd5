// The memory-mapped TensorDict reader against PhysicsNeMo's own golden
// `.pmsh` (written by Mesh.save; tests/fixtures/README.md), and its errors
// on broken trees.
#include "core/io/tensordict_memmap.h"

#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

namespace slipstream {
namespace {

namespace fs = std::filesystem;
using testing::error_message_of;

const std::string kGolden = testing::fixtures_dir() + "/v2.0_two_triangles.pmsh";

TEST(TensordictMemmap, ReadsPhysicsNemoGoldenMesh) {
  const MemmapTree mesh = read_tensordict_memmap(kGolden);
  EXPECT_EQ(mesh.type, "<class 'physicsnemo.mesh.mesh.Mesh'>");
  ASSERT_TRUE(mesh.has_tensor("points"));
  const auto& points = mesh.tensor("points");
  EXPECT_EQ(points.sizes(), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(points.scalar_type(), torch::kFloat);
  EXPECT_TRUE(
      torch::equal(points, torch::tensor({{0.f, 0.f}, {1.f, 0.f}, {0.5f, 1.f}, {1.5f, 0.5f}})));
  EXPECT_TRUE(
      torch::equal(mesh.tensor("cells"), torch::tensor({{0, 1, 2}, {1, 3, 2}}, torch::kLong)));
  const auto& pd = mesh.child("point_data");
  EXPECT_EQ(pd.batch_shape, (std::vector<int64_t>{4}));
  EXPECT_TRUE(torch::equal(pd.tensor("p_scalar"), torch::arange(4, torch::kFloat)));
  EXPECT_TRUE(
      torch::equal(pd.tensor("p_vector"), torch::arange(12, torch::kFloat).reshape({4, 3})));
  const auto& cd = mesh.child("cell_data");
  EXPECT_TRUE(torch::equal(cd.tensor("c_scalar"), torch::arange(2, torch::kFloat)));
  EXPECT_TRUE(torch::equal(cd.tensor("c_vector"), torch::arange(6, torch::kFloat).reshape({2, 3})));
  const auto& gd = mesh.child("global_data");
  EXPECT_EQ(gd.tensor("g_scalar").dim(), 0);
  EXPECT_FLOAT_EQ(gd.tensor("g_scalar").item<float>(), 42.f);
  EXPECT_TRUE(torch::equal(gd.tensor("g_vector"), torch::tensor({1.f, 2.f, 3.f})));
  EXPECT_TRUE(mesh.child("_cache").has_child("cell"));
}

TEST(TensordictMemmap, EncodesKeysAsTensordictDoes) {
  EXPECT_EQ(memmap_file_key("pMeanTrim"), "pMeanTrim");
  EXPECT_EQ(memmap_file_key("a/b c%"), "a%2Fb%20c%25");
  EXPECT_EQ(memmap_file_key(""), "%");
  EXPECT_EQ(memmap_file_key(".."), "%2E%2E");
}

void copy_tree(const std::string& from, const std::string& to) {
  fs::copy(from, to, fs::copy_options::recursive);
}

TEST(TensordictMemmap, TruncatedTensorFileNamesFileAndKey) {
  testing::TempDir dir;
  const std::string tree = dir.file("m.pmsh");
  copy_tree(kGolden, tree);
  const std::string file = tree + "/_tensordict/point_data/p_vector.memmap";
  fs::resize_file(file, 20);
  const auto msg = error_message_of([&] { read_tensordict_memmap(tree); });
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
  EXPECT_NE(msg.find("'p_vector'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(TensordictMemmap, MissingTensorFileAndMissingKeyAreNamed) {
  testing::TempDir dir;
  const std::string tree = dir.file("m.pmsh");
  copy_tree(kGolden, tree);
  fs::remove(tree + "/_tensordict/cells.memmap");
  auto msg = error_message_of([&] { read_tensordict_memmap(tree); });
  EXPECT_NE(msg.find("cells.memmap"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;

  const MemmapTree mesh = read_tensordict_memmap(kGolden);
  msg = error_message_of([&] { mesh.child("point_data").tensor("UMeanTrim"); });
  EXPECT_NE(msg.find("no tensor 'UMeanTrim'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("p_scalar, p_vector"), std::string::npos) << msg;
  msg = error_message_of([&] { mesh.child("boundaries"); });
  EXPECT_NE(msg.find("no 'boundaries'"), std::string::npos) << msg;
}

TEST(TensordictMemmap, NotATreeAndBadJsonAreNamed) {
  testing::TempDir dir;
  auto msg = error_message_of([&] { read_tensordict_memmap(dir.path()); });
  EXPECT_NE(msg.find(dir.path() + "/meta.json"), std::string::npos) << msg;
  std::ofstream(dir.file("meta.json")) << "{\"x\": ";
  msg = error_message_of([&] { read_tensordict_memmap(dir.path()); });
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
  std::ofstream(dir.file("meta.json"))
      << R"({"x": {"device": "cpu", "shape": [2], "dtype": "torch.complex64"}, "shape": []})";
  std::ofstream(dir.file("x.memmap")) << "12345678";
  msg = error_message_of([&] { read_tensordict_memmap(dir.path()); });
  EXPECT_NE(msg.find("unsupported dtype 'torch.complex64'"), std::string::npos) << msg;
}

}  // namespace
}  // namespace slipstream
