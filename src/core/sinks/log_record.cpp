#include "core/sinks/log_record.h"

#include <limits>

namespace slipstream {

double LogRecord::get(const std::string& key) const {
  for (const auto& f : fields) {
    if (f.key == key) return f.value;
  }
  return std::numeric_limits<double>::quiet_NaN();
}

std::string tensorboard_tag(const LogRecord& record, const Field& field) {
  const std::string prefix = record.per_step ? "iteration/" : "epoch/";
  switch (field.kind) {
    case FieldKind::kIndex:
      return {};
    case FieldKind::kLoss: {
      if (field.key == "loss") return prefix + "loss/total";
      const std::string lead = "loss/";
      if (field.key.compare(0, lead.size(), lead) == 0) return prefix + field.key;
      return prefix + "loss/" + field.key;
    }
    case FieldKind::kMetric:
      return prefix + "metrics/" + field.key;
    case FieldKind::kLearningRate:
      return prefix + "lr";
    case FieldKind::kPerformance:
      return prefix + "performance/" + field.key;
  }
  return {};
}

}  // namespace slipstream
