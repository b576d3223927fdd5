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

#include <cstdio>
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

uint32_t le_at(const std::string& b, size_t at, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
  return v;
}

void put_le(std::string& b, size_t at, uint32_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) b[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// `zip` (one entry) with its central directory entry repeated `copies`
// times under names of the same length ("e0000", "e0001", ...), each
// pointing at the one stored entry, or under one name.
std::string repeated_entries(const std::string& zip, int copies, bool one_name) {
  const size_t end = zip.size() - 22;
  const size_t dir = le_at(zip, end + 16, 4);
  const size_t name_len = le_at(zip, dir + 28, 2);
  const std::string record = zip.substr(dir, 46 + name_len);
  std::string out = zip.substr(0, dir);
  for (int i = 0; i < copies; ++i) {
    std::string r = record;
    if (!one_name) {
      char name[16];
      std::snprintf(name, sizeof name, "e%04d", i);
      r.replace(46, name_len, name, 5);
    }
    out += r;
  }
  std::string tail = zip.substr(end, 22);
  put_le(tail, 8, static_cast<uint32_t>(copies), 2);
  put_le(tail, 10, static_cast<uint32_t>(copies), 2);
  put_le(tail, 12, static_cast<uint32_t>(copies * record.size()), 4);
  return out + tail;
}

// A zip whose directory lists one 1 MB entry 4,000 times was read as 4 GB
// of copies; entries that share bytes, or a name, are refused at once.
TEST(ArchiveTest, EntriesThatShareBytesOrANameAreRefused) {
  const std::string zip = write_zip({{"e0000", std::string(1 << 20, 'x')}});
  ASSERT_EQ(read_archive(repeated_entries(zip, 1, false), "one.zip").size(), 1u);
  auto msg =
      error_message_of([&] { read_archive(repeated_entries(zip, 4000, false), "bomb.zip"); });
  EXPECT_NE(msg.find("bomb.zip"), std::string::npos) << msg;
  EXPECT_NE(msg.find("entry 'e0001' shares its bytes with entry 'e0000'"), std::string::npos)
      << msg;
  msg = error_message_of([&] { read_archive(repeated_entries(zip, 2, true), "twice.zip"); });
  EXPECT_NE(msg.find("entry 'e0000' appears twice"), std::string::npos) << msg;
}

// The pickle of a two-float state dict, with its tensor's size and stride
// bytes replaced, zipped again.
std::string with_size_and_stride(const std::string& size, const std::string& stride) {
  auto entries = read_archive(write_torch_state_dict({{"w", torch::ones({2})}}), "w.pt");
  std::string& pkl = entries.at("archive/data.pkl");
  const std::string was = std::string("(J\x02\x00\x00\x00t(J\x01\x00\x00\x00t", 14);
  const size_t at = pkl.find(was);
  EXPECT_NE(at, std::string::npos);
  pkl.replace(at, was.size(), "(" + size + "t(" + stride + "t");
  return write_zip({entries.begin(), entries.end()});
}

// Hostile pickles: a tensor of 16e9 elements over a storage of two (zero
// strides: a copy of 64 GB), and 200,000 nested tuples (freed by
// recursion, which overflowed the stack).
TEST(TorchSaveTest, HostilePicklesAreBoundedNotObeyed) {
  const std::string big = std::string("J\x00\xca\x9a\x3b", 5) + "K\x10";  // 1e9, 16
  auto msg = error_message_of([&] {
    read_torch_state_dict(with_size_and_stride(big, std::string("K\x00K\x00", 4)), "zero.pt");
  });
  EXPECT_NE(msg.find("zero.pt"), std::string::npos) << msg;
  EXPECT_NE(msg.find("a tensor of 16000000000 elements over its storage"), std::string::npos)
      << msg;
  // Plain strides over the same storage still read.
  const auto ok = read_torch_state_dict(
      with_size_and_stride(std::string("K\x02", 2), std::string("K\x01", 2)), "ok.pt");
  EXPECT_TRUE(torch::equal(ok.at(0).second, torch::ones({2})));
  std::string nested = "\x80\x02N" + std::string(200000, '\x85') + ".";
  msg = error_message_of([&] {
    read_torch_state_dict(write_zip({{"archive/data.pkl", nested}}), "deep.pt");
  });
  EXPECT_NE(msg.find("not a dict of tensors"), std::string::npos) << msg;
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
