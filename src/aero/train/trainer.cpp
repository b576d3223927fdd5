#include "aero/train/trainer.h"

#include "aero/ops/fp8_linear.h"
#include "aero/ops/parameter_casts.h"
#include "aero/train/graphed_step.h"
#include "aero/train/log_records.h"
#include "aero/train/memory_check.h"
#include "aero/train/run_checkpoints.h"
#include "aero/train/run_summary.h"
#include "aero/train/step_guard.h"
#include "aero/train/step_phases.h"
#include "aero/train/validation.h"
#include "core/device/device.h"
#include "core/io/atomic_file.h"
#include "core/process/stop_signal.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <optional>

namespace slipstream::aero {

Trainer::Trainer(Run& run) : run_(run) {}

Trainer::~Trainer() = default;

void Trainer::set_sync_audit(bool on) {
  audit_enabled_ = on;
  if (!on) audit_.stop();
}

std::unique_ptr<PrefetchLoader> Trainer::train_loader(int64_t epoch, int64_t first_step,
                                                      int64_t& steps) const {
  const auto& s = run_.settings();
  const auto order = epoch_order(run_.data.train->size(), epoch, s.seed, s.shuffle,
                                 run_.data_rank(), run_.data_world(), /*drop_last=*/true);
  steps = s.steps_per_epoch > 0 ? s.steps_per_epoch : static_cast<int64_t>(order.size());
  // A resumed epoch takes the samples it had left, each with its own seed.
  std::vector<size_t> epoch_samples;
  for (int64_t i = first_step; i < steps; ++i) epoch_samples.push_back(order[i % order.size()]);
  LoaderOptions options = run_.loader;
  options.augment = true;
  return std::make_unique<PrefetchLoader>(run_.data.train, std::move(epoch_samples), options,
                                          epoch);
}

void Trainer::setup_logging(const nlohmann::json& resume) {
  if (run_.rank == 0) open_run_logs(logger_, run_, resume, invocation_);
}

EpochResult Trainer::train_epoch(int64_t epoch, int64_t first_step) {
  setup_logging();
  const auto& s = run_.settings();
  const c10::Device device = run_.device;
  Model& model = *run_.model;
  model.train();
  int64_t steps = 0;
  std::unique_ptr<PrefetchLoader> loader_owner;
  if (next_loader_ && next_loader_epoch_ == epoch && first_step == 0) {
    loader_owner = std::move(next_loader_);
    steps = static_cast<int64_t>(loader_owner->size());
  } else {
    loader_owner = train_loader(epoch, first_step, steps);
  }
  next_loader_.reset();
  PrefetchLoader& loader = *loader_owner;
  // A graphed epoch runs on a stream of its own from its first step (a
  // graph is not captured on the default stream, and the gradients' autograd
  // nodes must be made on the stream it is captured on): set before the
  // loader and the readback take the current stream.
  const CudaGraphMode graph_mode = s.cuda_graph;
  const bool graph_steps = use_cuda_graph(graph_mode, device, run_.world_size) && !graphs_given_up_;
  std::optional<SideStreamGuard> graph_stream;
  if (graph_steps) {
    if (!graph_stream_) graph_stream_ = CudaGraph::side_stream(device);
    graph_stream.emplace(*graph_stream_);
  }
  reset_peak_memory(device);
  const int64_t epoch_start = global_step_ - first_step;
  StepMeans means = first_step > 0 ? partial_means_ : StepMeans{};
  StepGuard guard(run_.rank, run_.world_size, kMaxStepsInFlight);
  auto options = readback_options(run_, "train");
  options.max_in_flight = kMaxStepsInFlight;
  StepReadback readback(
      [&](StepRecord r) {
        guard.observe(r);
        means.add(r.values);
        if (run_.rank != 0) return;
        LogRecord record =
            step_log_record("train", r, epoch, r.step - epoch_start + 1, steps,
                            {{"global_step", static_cast<double>(r.step), FieldKind::kIndex},
                             {"epoch", static_cast<double>(epoch), FieldKind::kIndex}});
        record.epochs = s.num_epochs;
        logger_.write(record);
      },
      options);
  step_times_.clear();
  if (audit_enabled_ && !audit_.active()) audit_available_ = audit_.start();
  StepPhases phases(audit_);
  const auto phase = [&](Phase p) { phases.enter(p); };
  std::vector<torch::Tensor> params = model.parameters();
  // Under bf16 on CUDA the parameters are cast once a step, in one launch
  // (parameter_casts.h, unless numerics.parameter_casts is per_use).
  std::optional<ParameterCasts> casts;
  if (device.is_cuda() && run_.bf16() && ParameterCasts::enabled()) casts.emplace(params);
  // Forward, loss and backward: run as they are, or captured once into a
  // CUDA graph and replayed (graphed_step.h).
  const auto step_body = [&](const Batch& batch) {
    torch::Tensor prediction;
    {
      phase(Phase::kForward);
      AutocastGuard autocast(device, run_.bf16());
      if (casts) casts->refresh();
      // precision fp8: last step's amaxes into the scales (fp8_linear.h).
      if (run_.precision == Precision::kFp8) fp8::update_scales();
      const ParameterCasts::Scope cast_scope(casts ? &*casts : nullptr);
      prediction = model.forward(batch.inputs);
    }
    phase(Phase::kLoss);
    LossResult result =
        run_.loss->compute(prediction, batch.target, batch.weights, batch.force_weights);
    phase(Phase::kBackward);
    run_.optimizer->zero_grad();
    if (run_.averager) run_.averager->prepare();
    result.total.backward();
    if (run_.averager) run_.averager->finish();
    return result;
  };
  std::optional<GraphedStep> graphed;
  if (graph_steps) graphed.emplace(device);
  const auto epoch_t0 = Clock::now();
  int64_t done = first_step;
  double data_seconds = 0;
  {
    ReadbackScope scope(readback);
    for (int64_t i = first_step; i < steps; ++i) {
      const auto t0 = Clock::now();
      if (step_hook_) step_hook_(i);
      // Steps 0 and 1 allocate and warm caches; the audit counts from step 2.
      if (audit_.active() && i >= first_step + 2) audit_.begin_steady_step();
      phase(Phase::kLoader);
      const auto wait_t0 = Clock::now();
      Batch batch = loader.next();
      const double data_time = seconds_since(wait_t0);
      data_seconds += data_time;
      if (!memory_checked_) {
        memory_checked_ = true;
        check_step_memory(run_, batch);
      }
      if (!loader.has_next() && epoch < s.num_epochs) {
        int64_t next_steps = 0;
        next_loader_ = train_loader(epoch + 1, 0, next_steps);
        next_loader_epoch_ = epoch + 1;
      }
      // The first step of an epoch runs eagerly (it allocates and warms the
      // caches); the graph is captured at the next.
      if (graphed && i > first_step) phase(Phase::kForward);
      LossResult result = i > first_step ? run_graphed_step(graphed, graphs_given_up_, graph_mode,
                                                            global_step_, batch, step_body)
                                         : step_body(batch);
      phase(Phase::kOptimizer);
      std::vector<torch::Tensor> grads;
      grads.reserve(params.size());
      for (const auto& p : params) grads.push_back(p.grad());
      guard.add_controls(result.scalars, result.total, grads, StopSignals::requested() != 0);
      const double lr = run_.optimizer->lr();
      run_.optimizer->step();
      const double step_time = seconds_since(t0);
      step_times_.push_back(step_time);
      phase(Phase::kReadback);
      readback.start(global_step_, result.scalars,
                     {{"lr", lr},
                      {"step_time_s", step_time},
                      {"data_time_s", data_time},
                      {"points", batch_points(batch, run_.world_size)},
                      {"mem_gb", memory_reserved_gib(device)}});
      ++global_step_;
      ++done;
      if (s.scheduler_per_step) run_.optimizer->set_lr(scheduled_lr(s, global_step_));
      phase(Phase::kLogging);
      readback.deliver_landed();
      if (audit_.active()) audit_.end_steady_step();
      if (guard.stop_after(global_step_ - 1)) break;  // every rank breaks after this step
      // One process has no peer to agree with: a stop ends the epoch here.
      if (run_.world_size == 1 && StopSignals::requested() != 0) break;
    }
    phase(Phase::kOther);
    readback.drain();
    phases.end();
  }
  guard.throw_if_nonfinite();
  EpochResult r = finish_epoch(run_, logger_, "train", epoch, done, seconds_since(epoch_t0),
                               data_seconds, means.means());
  r.interrupted = done < steps;
  r.graph_captures = graphed ? graphed->captures() : 0;
  partial_means_ = r.interrupted ? means : StepMeans{};
  return r;
}

EpochResult Trainer::val_epoch(int64_t epoch) {
  setup_logging();
  return validate_epoch(run_, logger_, epoch, val_step_);
}

std::string Trainer::sync_audit_report() const {
  if (!audit_available_) {
    return "Sync audit: not available (this build has no CUDA; nothing was counted)\n";
  }
  return audit_.report();
}

void Trainer::note_best(TrainResult& result) const {
  const auto best = run_.settings().keep_best ? best_checkpoint(dir_->checkpoints()) : std::nullopt;
  result.best_checkpoint = best ? best->path : std::string();
  result.best_epoch = best ? best->epoch : 0;
  result.best_val_loss = best ? best->val_loss : 0.0;
}

TrainResult Trainer::fit() {
  const auto& s = run_.settings();
  if (run_.rank == 0) dir_ = std::make_unique<RunDirectory>(s.run_dir());
  const TrainPosition start = resume_position(run_, dir_.get());
  global_step_ = start.global_step;
  val_step_ = start.val_step;
  partial_means_ = StepMeans::from_state(start.epoch_means);
  const bool resumed = start.global_step > 0 || start.epochs_done > 0;
  setup_logging(resumed ? nlohmann::json{{"global_step", start.global_step},
                                         {"epochs_done", start.epochs_done},
                                         {"steps_into_epoch", start.steps_into_epoch}}
                        : nlohmann::json(false));
  if (run_.rank == 0) {  // supersedes what an earlier start logged past these steps
    logger_.start_session("train", start.global_step);
    logger_.start_session("val", start.val_step);
  }
  // For the checkpoints; every rank reads it alike, so that none waits for
  // rank 0 in a collective meanwhile.
  run_.envelope = envelope_of(*run_.data.train);
  StopSignals::set_stop_note(
      run_.world_size == 1
          ? "finishing the step in progress, then a checkpoint"
          : "finishing the step in progress and at most 4 more (every rank stops after the "
            "same step), then a checkpoint");
  StopSignals::install();
  const auto session_t0 = Clock::now();
  TrainResult result;
  result.run_dir = s.run_dir();
  result.start_epoch = start.epochs_done;
  result.epochs_done = start.epochs_done;
  if (run_.rank == 0) note_best(result);
  for (int64_t epoch = start.epochs_done + 1; epoch <= s.num_epochs; ++epoch) {
    if (!s.scheduler_per_step) run_.optimizer->set_lr(scheduled_lr(s, epoch - 1));
    const int64_t first = epoch == start.epochs_done + 1 ? start.steps_into_epoch : 0;
    result.train.push_back(train_epoch(epoch, first));
    const auto& r = result.train.back();
    if (r.interrupted) {  // a signal, mid-epoch: continue this epoch on resume
      result.last_checkpoint = save_run_checkpoint(
          run_, {epoch - 1, r.steps, global_step_, val_step_, partial_means_.state()});
      result.stop_signal = StopSignals::requested();
      break;
    }
    std::optional<double> val_loss;
    if (s.validate && run_.data.val->size() > 0) {
      result.val.push_back(val_epoch(epoch));
      const auto& means = result.val.back().means;
      if (means.count("loss")) val_loss = means.at("loss");
    }
    if (run_.rank == 0) logger_.end_epoch(epoch);
    result.epochs_done = epoch;
    const bool stop = any_rank_requests_stop(run_);
    if (stop || epoch % s.save_interval == 0 || epoch == s.num_epochs) {
      result.last_checkpoint =
          save_run_checkpoint(run_, {epoch, 0, global_step_, val_step_, nullptr}, val_loss);
      if (run_.rank == 0) note_best(result);
    }
    if (stop) {
      result.stop_signal = StopSignals::requested() != 0 ? StopSignals::requested() : SIGTERM;
      break;
    }
  }
  result.global_step = global_step_;
  result.seconds = seconds_since(session_t0);
  if (run_.rank == 0) {
    result.summary = run_summary(run_, result, invocation_);
    logger_.write_document("run_summary", result.summary);
    write_file_atomically(dir_->path() + "/summary.json", result.summary.dump(2) + "\n");
  }
  logger_.flush();
  return result;
}

}  // namespace slipstream::aero
