// torch.save's state-dict format and the archives under it: PyTorch's own
// file (the fixture written by Python's torch.save) reads back to the same
// tensors as the safetensors fixture; our files read back bitwise; zip data
// is aligned; damage, truncation and foreign pickles are clear errors.
#include "core/io/torch_save.h"
#include "core/io/archive.h"
#include "core/io/safetensors.h"

#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <iterator>
#include <string>

namespace slipstream {
namespace {

using testing::error_message_of;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST(TorchSaveTest, ReadsWhatPythonsTorchSaveWrote) {
  const auto dir = testing::fixtures_dir();
  const auto got =
      read_torch_state_dict(slurp(dir + "/transolver_small.pt"), "transolver_small.pt");
  const auto want = read_safetensors(dir + "/transolver_small.safetensors");
  // The same tensors under the same names, in the file's order.
  ASSERT_EQ(got.size(), want.tensors.size());
  for (const auto& [name, t] : want.tensors) {
    bool found = false;
    for (const auto& [k, v] : got) {
      if (k != name) continue;
      found = true;
      EXPECT_EQ(v.sizes(), t.sizes()) << name;
      EXPECT_TRUE(torch::equal(v, t)) << name;
    }
    EXPECT_TRUE(found) << name;
  }
}

TEST(TorchSaveTest, WhatWeWriteReadsBackBitwiseInOrder) {
  torch::manual_seed(3);
  NamedTensors in = {{"a.weight", torch::randn({4, 3})},
                     {"b", torch::randn({5, 6}).t()},  // not contiguous
                     {"c.bf16", torch::randn({7}).to(torch::kBFloat16)},
                     {"d.steps", torch::arange(3, torch::kLong)},
                     {"e.scalar", torch::tensor(2.5)},
                     {"f.empty", torch::zeros({0, 3})}};
  const auto out = read_torch_state_dict(write_torch_state_dict(in), "ours");
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].first, in[i].first);
    EXPECT_EQ(out[i].second.scalar_type(), in[i].second.scalar_type()) << in[i].first;
    EXPECT_TRUE(torch::equal(out[i].second, in[i].second)) << in[i].first;
  }
}

TEST(TorchSaveTest, AForeignPickleIsAnErrorNamingWhatItCalls) {
  // A pickle that would call os.system: the reader refuses, naming it.
  std::string evil =
      "\x80\x02"
      "cos\nsystem\nX";
  evil += std::string("\x02\x00\x00\x00", 4) + "ls\x85R.";
  const auto zip = write_zip({{"archive/data.pkl", evil}});
  const auto msg = error_message_of([&] { read_torch_state_dict(zip, "evil.pt"); });
  EXPECT_NE(msg.find("os.system"), std::string::npos) << msg;
  EXPECT_NE(msg.find("evil.pt"), std::string::npos) << msg;
  const auto none = error_message_of([&] {
    read_torch_state_dict(write_zip({{"x", "y"}}), "x.pt");
  });
  EXPECT_NE(none.find("no data.pkl"), std::string::npos) << none;
}

TEST(ArchiveTest, ZipRoundTripsWithAlignedDataAndChecksDamage) {
  const std::vector<std::pair<std::string, std::string>> entries = {
      {"one", "hello"}, {"dir/two", std::string(1000, 'x')}, {"empty", ""}};
  const std::string zip = write_zip(entries, 64);
  const auto back = read_archive(zip, "t.zip");
  ASSERT_EQ(back.size(), 3u);
  for (const auto& [name, data] : entries) EXPECT_EQ(back.at(name), data) << name;
  EXPECT_EQ(zip.find(std::string(1000, 'x')) % 64, 0u);  // aligned
  EXPECT_EQ(crc32_ieee("123456789", 9), 0xcbf43926u);    // the standard check value
  std::string damaged = zip;
  damaged[zip.find("hello")] = 'j';
  auto msg = error_message_of([&] { read_archive(damaged, "t.zip"); });
  EXPECT_NE(msg.find("'one' is damaged"), std::string::npos) << msg;
  msg = error_message_of([&] { read_archive(zip.substr(0, zip.size() / 2), "half.zip"); });
  EXPECT_NE(msg.find("half.zip"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  msg = error_message_of([&] { read_archive("just text", "t.txt"); });
  EXPECT_NE(msg.find("neither a zip nor a tar"), std::string::npos) << msg;
}

std::string tar_entry(const std::string& name, const std::string& data) {
  std::string h(512, '\0');
  h.replace(0, name.size(), name);
  char size[12];
  std::snprintf(size, sizeof size, "%011o", static_cast<unsigned>(data.size()));
  h.replace(124, 11, size);
  h[156] = '0';
  h.replace(257, 5, "ustar");
  std::string body = data;
  body.resize((data.size() + 511) / 512 * 512, '\0');
  return h + body;
}

TEST(ArchiveTest, ReadsTarAsOlderPhysicsNeMoWroteIt) {
  const std::string tar = tar_entry("./args.json", "{}") +
                          tar_entry("model.pt", std::string(700, 'm')) + std::string(1024, '\0');
  const auto back = read_archive(tar, "old.mdlus");
  EXPECT_EQ(back.at("args.json"), "{}");
  EXPECT_EQ(back.at("model.pt"), std::string(700, 'm'));
  const auto msg = error_message_of([&] { read_archive(tar.substr(0, 900), "cut.mdlus"); });
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

}  // namespace
}  // namespace slipstream
