// The progress bar off a terminal: quarter lines for long work, nothing for
// short work.
#include "core/io/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace slipstream {
namespace {

std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string out;
  for (int c; (c = std::fgetc(f)) != EOF;) out.push_back(static_cast<char>(c));
  return out;
}

TEST(ProgressBarTest, OffATerminalPrintsQuartersOfLongWorkOnly) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressBar bar("reading x.vtu", /*quiet_s=*/0.0, f);
    bar.update(0.3);
    bar.update(0.3);
    bar.update(0.8);
    bar.finish();
    bar.update(1.0);
  }
  const std::string out = contents(f);
  EXPECT_NE(out.find("reading x.vtu: 25%"), std::string::npos) << out;
  EXPECT_NE(out.find("reading x.vtu: 50%"), std::string::npos) << out;
  EXPECT_NE(out.find("reading x.vtu: 75%"), std::string::npos) << out;
  EXPECT_NE(out.find("reading x.vtu: 100%"), std::string::npos) << out;
  EXPECT_EQ(out.find("25%", out.find("25%") + 1), std::string::npos) << "printed twice: " << out;
  std::fclose(f);

  f = std::tmpfile();
  {
    ProgressBar bar("short", /*quiet_s=*/3600.0, f);
    bar.finish();
  }
  EXPECT_EQ(contents(f), "");
  std::fclose(f);
}

}  // namespace
}  // namespace slipstream
