#include "aero/train/validation.h"

#include "aero/train/log_records.h"
#include "core/device/device.h"
#include "core/readback/step_means.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace slipstream::aero {

EpochResult validate_epoch(Run& run, MetricsLogger& logger, int64_t epoch, int64_t& val_step) {
  const auto& s = run.settings();
  Model& model = *run.model;
  model.eval();
  torch::NoGradGuard no_grad;
  const auto order = epoch_order(run.data.val->size(), epoch, s.seed, /*shuffle=*/false,
                                 run.data_rank(), run.data_world(), /*drop_last=*/false);
  const int64_t steps = static_cast<int64_t>(order.size());
  PrefetchLoader loader(run.data.val, order, run.loader, /*epoch=*/0);
  StepMeans means;
  const int64_t first = val_step;
  std::vector<std::string> step_samples;
  std::vector<std::string> nonfinite_samples;
  StepReadback readback(
      [&](const StepRecord& r) {
        means.add(r.values);
        const auto loss = std::find_if(r.values.begin(), r.values.end(),
                                       [](const auto& kv) { return kv.first == "loss"; });
        if (loss != r.values.end() && !std::isfinite(loss->second)) {
          nonfinite_samples.push_back(step_samples.at(static_cast<size_t>(r.step - first)));
        }
        if (run.rank != 0) return;
        LogRecord record =
            step_log_record("val", r, epoch, r.step - first + 1, steps,
                            {{"epoch", static_cast<double>(epoch), FieldKind::kIndex},
                             {"val_step", static_cast<double>(r.step - first), FieldKind::kIndex}});
        record.epochs = s.num_epochs;
        logger.write(record);
      },
      readback_options(run, "val"));
  const auto epoch_t0 = Clock::now();
  double data_seconds = 0;
  {
    ReadbackScope scope(readback);
    for (int64_t i = 0; i < steps; ++i) {
      const auto t0 = Clock::now();
      Batch batch = loader.next();
      const double data_time = seconds_since(t0);
      data_seconds += data_time;
      step_samples.push_back(batch.sample_id);
      torch::Tensor prediction;
      {
        AutocastGuard autocast(run.device, run.bf16());
        prediction = model.forward(batch.inputs);
      }
      LossResult result =
          run.loss->compute(prediction, batch.target, batch.weights, batch.force_weights);
      readback.start(val_step++, result.scalars,
                     {{"step_time_s", seconds_since(t0)}, {"data_time_s", data_time}});
      readback.deliver_landed();
    }
    readback.drain();
  }
  auto summary = means.means();
  summary["nonfinite_steps"] = static_cast<double>(nonfinite_samples.size());
  if (!nonfinite_samples.empty()) {
    std::string names;
    for (const auto& id : nonfinite_samples) names += (names.empty() ? "" : ", ") + id;
    std::fprintf(stderr,
                 "val: epoch %lld: %zu of %lld steps had a non-finite loss on rank %d (%s); the "
                 "summary's means leave them out\n",
                 static_cast<long long>(epoch), nonfinite_samples.size(),
                 static_cast<long long>(steps), run.rank, names.c_str());
  }
  return finish_epoch(run, logger, "val", epoch, steps, seconds_since(epoch_t0), data_seconds,
                      summary);
}

}  // namespace slipstream::aero
