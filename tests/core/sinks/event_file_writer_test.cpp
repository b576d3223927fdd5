#include "core/sinks/event_file_writer.h"
#include "core/sinks/tensorboard_sink.h"
#include "support/test_support.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace slipstream {
namespace {

TEST(EventFileWriterTest, RoundTripChecksEveryCrc) {
  testing::TempDir dir;
  std::string path;
  {
    EventFileWriter writer(dir.path() + "/tb");
    path = writer.path();
    for (int step = 0; step < 5; ++step) {
      writer.add_scalars(step, 1000.5 + step,
                         {{"iteration/loss/total", 1.0f / (step + 1)}, {"iteration/lr", 1e-3f}});
    }
  }
  const auto name = std::filesystem::path(path).filename().string();
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  const auto events = read_event_file(path);
  ASSERT_EQ(events.size(), 6u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  for (int step = 0; step < 5; ++step) {
    const auto& ev = events[step + 1];
    EXPECT_EQ(ev.step, step);
    EXPECT_EQ(ev.wall_time, 1000.5 + step);
    ASSERT_EQ(ev.scalars.size(), 2u);
    EXPECT_EQ(ev.scalars[0].first, "iteration/loss/total");
    EXPECT_EQ(ev.scalars[0].second, 1.0f / (step + 1));
    EXPECT_EQ(ev.scalars[1].first, "iteration/lr");
  }
}

TEST(EventFileWriterTest, CorruptedByteIsReportedWithTheFileAndOffset) {
  testing::TempDir dir;
  std::string path;
  {
    EventFileWriter writer(dir.path());
    path = writer.path();
    writer.add_scalars(1, 1.0, {{"a", 1.0f}});
  }
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(-6, std::ios::end);  // inside the last record's data
  f.put('\x7f');
  f.close();
  try {
    read_event_file(path);
    FAIL() << "a corrupted record must not read back";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("CRC"), std::string::npos) << msg;
  }
}

TEST(EventFileWriterTest, KnownEncodingOfAScalarEvent) {
  // Event{wall_time=0, step=1, summary{value{tag="a", simple_value=1.0}}}
  const std::string got = encode_scalar_event(1, 0.0, {{"a", 1.0f}});
  const std::string want(
      "\x09\0\0\0\0\0\0\0\0"  // field 1 fixed64
      "\x10\x01"              // field 2 varint 1
      "\x2a\x0a"              // field 5, 10 bytes
      "\x0a\x08"              // Summary.value, 8 bytes
      "\x0a\x01"
      "a"                      // tag
      "\x15\x00\x00\x80\x3f",  // simple_value 1.0f
      23);
  EXPECT_EQ(got, want);
}

TEST(TensorBoardSinkTest, WritesOneFilePerPhaseWithRecipeTags) {
  testing::TempDir dir;
  TensorBoardSink sink(dir.path());
  LogRecord r;
  r.kind = "train_step";
  r.phase = "train";
  r.tb_step = 3;
  r.fields = {
      {"global_step", 3, FieldKind::kIndex},     {"loss", 0.5, FieldKind::kLoss},
      {"loss/pressure", 0.25, FieldKind::kLoss}, {"pressure_l2", 0.1, FieldKind::kMetric},
      {"lr", 1e-3, FieldKind::kLearningRate},    {"step_time_s", 0.2, FieldKind::kPerformance}};
  sink.write(r);
  LogRecord v = r;
  v.phase = "val";
  v.per_step = false;
  sink.write(v);
  ASSERT_NE(sink.writer("train"), nullptr);
  ASSERT_NE(sink.writer("val"), nullptr);
  EXPECT_EQ(std::filesystem::path(sink.writer("train")->path()).parent_path().filename(), "train");
  const auto train = read_event_file(sink.writer("train")->path());
  ASSERT_EQ(train.size(), 2u);
  std::vector<std::string> tags;
  for (const auto& [tag, value] : train[1].scalars) tags.push_back(tag);
  EXPECT_EQ(tags, (std::vector<std::string>{"iteration/loss/total", "iteration/loss/pressure",
                                            "iteration/metrics/pressure_l2", "iteration/lr",
                                            "iteration/performance/step_time_s"}));
  const auto val = read_event_file(sink.writer("val")->path());
  EXPECT_EQ(val[1].scalars[0].first, "epoch/loss/total");
}

}  // namespace
}  // namespace slipstream
