// Several files read as one seekable stream: the bytes of the concatenation,
// from anywhere, across piece boundaries and after seeks; a missing piece is
// an error naming it.
#include "core/io/concatenated_files.h"

#include "support/test_support.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

namespace slipstream {
namespace {

TEST(ConcatenatedFilesTest, ReadsAndSeeksAcrossPieces) {
  testing::TempDir dir;
  std::string whole;
  std::vector<std::string> paths;
  for (int i = 0; i < 4; ++i) {
    std::string piece;
    for (int k = 0; k < 1000 + 777 * i; ++k) piece += static_cast<char>('a' + (k * 7 + i) % 26);
    if (i == 2) piece.clear();  // an empty piece is allowed
    paths.push_back(dir.path() + "/p." + std::to_string(i) + ".part");
    std::ofstream(paths.back(), std::ios::binary) << piece;
    whole += piece;
  }
  ConcatenatedFilesStream in(paths);
  EXPECT_EQ(in.total_size(), static_cast<int64_t>(whole.size()));
  const std::string all((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(all, whole);
  for (const int64_t at : {int64_t{0}, int64_t{999}, int64_t{1000}, int64_t{1776}, int64_t{2777},
                           static_cast<int64_t>(whole.size()) - 5}) {
    in.clear();
    in.seekg(at);
    std::string got(5, '\0');
    in.read(got.data(), 5);
    EXPECT_EQ(got, whole.substr(at, 5)) << at;
    EXPECT_EQ(static_cast<int64_t>(in.tellg()), at + 5) << at;
  }
  in.seekg(-3, std::ios::end);
  std::string tail(3, '\0');
  in.read(tail.data(), 3);
  EXPECT_EQ(tail, whole.substr(whole.size() - 3));
  const auto msg = testing::error_message_of([&] {
    ConcatenatedFilesStream missing({paths[0], dir.path() + "/gone.part"});
  });
  EXPECT_NE(msg.find("gone.part"), std::string::npos) << msg;
}

}  // namespace
}  // namespace slipstream
