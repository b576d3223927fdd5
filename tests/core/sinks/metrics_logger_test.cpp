#include "core/sinks/metrics_logger.h"
#include "core/sinks/console_sink.h"
#include "support/test_support.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace slipstream {
namespace {

struct CountingSink : Sink {
  std::vector<std::string>* seen;
  bool fail = false;
  explicit CountingSink(std::vector<std::string>* s, bool f = false) : seen(s), fail(f) {}
  std::string name() const override { return fail ? "broken" : "counting"; }
  void write(const LogRecord& r) override {
    if (fail) throw std::runtime_error("disk full");
    seen->push_back(r.kind);
  }
};

TEST(MetricsLoggerTest, EveryRecordReachesEverySinkAndAFailingSinkNeverStopsTheRest) {
  std::vector<std::string> a, b;
  MetricsLogger logger;
  logger.add_sink(std::make_unique<CountingSink>(&a));
  logger.add_sink(std::make_unique<CountingSink>(&b, /*fail=*/true));
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) {
    LogRecord r;
    r.kind = "train_step";
    EXPECT_NO_THROW(logger.write(r));
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(logger.failure_counts(), (std::vector<size_t>{0, 3}));
  // Reported once, naming the sink.
  EXPECT_NE(err.find("'broken'"), std::string::npos) << err;
  EXPECT_EQ(err.find("'broken'"), err.rfind("'broken'")) << err;
}

TEST(ConsoleSinkTest, PrintsTheRecipeLineAndAnEpochTable) {
  testing::TempDir dir;
  const std::string path = dir.file("console.txt");
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  {
    ConsoleSink sink(f, 1);
    LogRecord r;
    r.kind = "train_step";
    r.phase = "train";
    r.epoch = 3;
    r.index_in_epoch = 12;
    r.steps_in_epoch = 50;
    r.fields = {{"loss", 0.123456, FieldKind::kLoss},
                {"step_time_s", 0.107, FieldKind::kPerformance},
                {"mem_gb", 12.34, FieldKind::kPerformance}};
    sink.write(r);
    LogRecord s;
    s.kind = "train_summary";
    s.phase = "train";
    s.per_step = false;
    s.fields = {{"loss", 0.5, FieldKind::kLoss}};
    sink.write(s);
    s.phase = "val";
    s.fields = {{"loss", 0.75, FieldKind::kLoss}};
    sink.write(s);
    sink.end_epoch(3);
  }
  std::fclose(f);
  const auto lines = testing::read_lines(path);
  ASSERT_GE(lines.size(), 3u);
  EXPECT_EQ(lines[0], "Epoch 3 [12/50] Loss: 0.123456 Step: 0.107s Mem: 12.34GB");
  std::stringstream all;
  for (const auto& l : lines) all << l << "\n";
  EXPECT_NE(all.str().find("0.5"), std::string::npos);
  EXPECT_NE(all.str().find("0.75"), std::string::npos);
}

}  // namespace
}  // namespace slipstream
