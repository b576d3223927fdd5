#include "core/io/safetensors.h"
#include "support/test_support.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace slipstream {
namespace {

TEST(SafetensorsTest, RoundTripKeepsOrderDtypesAndMetadata) {
  testing::TempDir dir;
  const std::string path = dir.file("a.safetensors");
  auto a = at::arange(12, at::kFloat).view({3, 4});
  auto b = at::tensor({1, -2, 3}, at::kLong);
  auto c = at::rand({5}, at::kDouble);
  write_safetensors(path, {{"z_first", a}, {"b", b}, {"c", c}}, {{"note", "hi"}});
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
  const auto f = read_safetensors(path);
  ASSERT_EQ(f.tensors.size(), 3u);
  EXPECT_EQ(f.tensors[0].first, "z_first");
  EXPECT_TRUE(at::equal(f.at("z_first"), a));
  EXPECT_TRUE(at::equal(f.at("b"), b));
  EXPECT_TRUE(at::equal(f.at("c"), c));
  EXPECT_EQ(f.metadata.at("note"), "hi");
}

TEST(SafetensorsTest, ReadsTheFixtureWrittenByTheReferenceLibrary) {
  const auto f = read_safetensors(testing::fixtures_dir() + "/muon_two_steps.safetensors");
  EXPECT_EQ(f.at("wide.param0").sizes(), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(f.at("tall.grad2").scalar_type(), at::kFloat);
  EXPECT_TRUE(f.metadata.count("defaults"));
}

TEST(SafetensorsTest, TruncatedAndEmptyFilesNameTheFile) {
  testing::TempDir dir;
  const std::string path = dir.file("t.safetensors");
  write_safetensors(path, {{"x", at::rand({100})}});
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 10);
  try {
    read_safetensors(path);
    FAIL();
  } catch (const c10::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("'x'"), std::string::npos) << msg;
  }
  const std::string empty = dir.file("empty.safetensors");
  std::ofstream(empty).close();
  EXPECT_THROW(read_safetensors(empty), c10::Error);
  EXPECT_THROW(read_safetensors(dir.file("missing.safetensors")), c10::Error);
}

}  // namespace
}  // namespace slipstream
