#include "core/sinks/metrics_logger.h"
#include "core/sinks/console_sink.h"
#include "support/test_support.h"

#include <gtest/gtest.h>

#include <cmath>
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

TEST(ConsoleSinkTest, PrintsProgressWithTimeLeftAndAnEpochTableWithTheRunsTimeLeft) {
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
    r.epochs = 8;
    r.steps_in_epoch = 50;
    // The first step (slow: it warms up) is left out of the time left.
    for (int64_t i = 1; i <= 3; ++i) {
      r.index_in_epoch = i;
      r.fields = {{"loss", 0.123456, FieldKind::kLoss},
                  {"step_time_s", i == 1 ? 5.0 : 0.5, FieldKind::kPerformance},
                  {"data_time_s", 0.3, FieldKind::kPerformance},
                  {"points", 4000, FieldKind::kPerformance},
                  {"mem_gb", 12.34, FieldKind::kPerformance}};
      sink.write(r);
    }
    LogRecord v;
    v.kind = "val_step";
    v.phase = "val";
    v.epoch = 3;
    v.epochs = 8;
    v.index_in_epoch = 1;
    v.steps_in_epoch = 4;
    v.fields = {{"loss", 0.25, FieldKind::kLoss}, {"step_time_s", 1.0, FieldKind::kPerformance}};
    sink.write(v);
    LogRecord s;
    s.kind = "train_summary";
    s.phase = "train";
    s.per_step = false;
    s.fields = {{"loss", 0.5, FieldKind::kLoss}, {"epoch_seconds", 60, FieldKind::kPerformance}};
    sink.write(s);
    s.phase = "val";
    s.fields = {{"loss", 0.75, FieldKind::kLoss}, {"epoch_seconds", 15, FieldKind::kPerformance}};
    sink.write(s);
    sink.end_epoch(3);
  }
  std::fclose(f);
  const auto lines = testing::read_lines(path);
  ASSERT_GE(lines.size(), 6u);
  EXPECT_EQ(
      lines[0],
      "Epoch 3/8 [1/50] 0:05<4:05 Loss: 0.123456 Step: 5.000s 800 pts/s Data: 6% Mem: 12.34GB");
  // 47 steps left at the later steps' 0.5 s; 12000 points in 6 s, 0.9 s of it waiting.
  EXPECT_EQ(
      lines[2],
      "Epoch 3/8 [3/50] 0:06<0:24 Loss: 0.123456 Step: 0.500s 2.0k pts/s Data: 15% Mem: 12.34GB");
  EXPECT_EQ(lines[3], "Validation 3/8 [1/4] 0:01<0:03 Loss: 0.250000");
  // 75 s an epoch, five epochs to go.
  EXPECT_EQ(lines[4], "Epoch 3/8 summary (1:15; about 6:15 left for epochs 4-8)");
  std::stringstream all;
  for (const auto& l : lines) all << l << "\n";
  EXPECT_NE(all.str().find("0.5"), std::string::npos);
  EXPECT_NE(all.str().find("0.75"), std::string::npos);
}

TEST(ConsoleSinkTest, DurationsReadAsClockTimes) {
  EXPECT_EQ(format_duration(0.4), "0:00");
  EXPECT_EQ(format_duration(65), "1:05");
  EXPECT_EQ(format_duration(3 * 3600 + 62), "3:01:02");
  EXPECT_EQ(format_duration(std::nan("")), "?");
}

}  // namespace
}  // namespace slipstream
