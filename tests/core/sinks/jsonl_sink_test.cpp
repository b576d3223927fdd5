#include "core/sinks/jsonl_sink.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

namespace slipstream {
namespace {

TEST(JsonlSinkTest, OneParseableRecordPerLineInOrder) {
  testing::TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  {
    JsonlSink sink(path);
    sink.write_document("config", nlohmann::json{{"model", "transolver"}});
    for (int step = 0; step < 20; ++step) {
      LogRecord r;
      r.kind = "train_step";
      r.fields = {{"global_step", double(step), FieldKind::kIndex},
                  {"loss", 1.0 / (step + 1), FieldKind::kLoss},
                  {"nut_l2", step == 4 ? NAN : 0.5, FieldKind::kMetric}};
      sink.write(r);
      // Flushed per record: the line is on disk before the next write.
      EXPECT_EQ(testing::read_lines(path).size(), static_cast<size_t>(step + 2));
    }
  }
  const auto lines = testing::read_lines(path);
  ASSERT_EQ(lines.size(), 21u);
  const auto config = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(config["phase"], "config");
  EXPECT_EQ(config["model"], "transolver");  // a document's keys at the top, as the recipe's
  for (int step = 0; step < 20; ++step) {
    const auto j = nlohmann::json::parse(lines[step + 1]);
    EXPECT_EQ(j["phase"], "train_step");
    EXPECT_FALSE(j.contains("kind"));
    EXPECT_EQ(j["global_step"], step);
    EXPECT_EQ(j["loss"].get<double>(), 1.0 / (step + 1));
    EXPECT_EQ(j["loss/total"].get<double>(), 1.0 / (step + 1));
    const std::string ts = j["ts"];
    EXPECT_EQ(ts.size(), 24u) << ts;
    EXPECT_EQ(ts.back(), 'Z');
    if (step == 4) {
      EXPECT_TRUE(j["nut_l2"].is_null());
    }
  }
}

TEST(JsonlSinkTest, UnwritablePathNamesTheFile) {
  try {
    JsonlSink sink("/nonexistent-dir/metrics.jsonl");
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/metrics.jsonl"), std::string::npos);
  }
}

}  // namespace
}  // namespace slipstream
