#include "aero/train/run_summary.h"

#include "core/sinks/console_sink.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>

namespace slipstream::aero {

namespace {

std::string quoted_word(const std::string& w) {
  const bool plain = !w.empty() && std::all_of(w.begin(), w.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || std::strchr("-_./=:,+@%", c);
  });
  if (plain) return w;
  std::string out = "'";
  for (char c : w) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

nlohmann::json means_json(const std::vector<EpochResult>& epochs) {
  if (epochs.empty()) return nullptr;
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, value] : epochs.back().means) {
    if (std::isfinite(value)) out[key] = value;
  }
  return out;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "a signal";
  }
}

}  // namespace

std::string shell_command(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + quoted_word(w);
  return out;
}

nlohmann::json run_summary(const Run& run, const TrainResult& result,
                           const nlohmann::json& invocation) {
  const auto& s = run.settings();
  nlohmann::json j;
  j["run_id"] = s.run_id;
  j["run_dir"] = result.run_dir;
  const bool finished = result.stop_signal == 0 && result.epochs_done >= s.num_epochs;
  j["status"] = finished ? "finished" : "stopped";
  if (result.stop_signal != 0) j["signal"] = signal_name(result.stop_signal);
  j["epochs_done"] = result.epochs_done;
  j["num_epochs"] = s.num_epochs;
  j["global_step"] = result.global_step;
  j["session_seconds"] = result.seconds;
  j["session_epochs"] = {result.start_epoch + 1,
                         std::max(result.start_epoch + 1, result.epochs_done)};
  if (result.best_checkpoint.empty()) {
    j["best"] = nullptr;
  } else {
    j["best"] = {{"epoch", result.best_epoch},
                 {"val_loss", result.best_val_loss},
                 {"checkpoint", result.best_checkpoint}};
  }
  j["last_checkpoint"] = result.last_checkpoint;
  j["last_epoch"] = {{"train", means_json(result.train)}, {"val", means_json(result.val)}};
  j["invocation"] = invocation;
  // What to run next, on the best checkpoint where there is one.
  const std::string model =
      result.best_checkpoint.empty() ? result.run_dir : result.best_checkpoint;
  const std::string split = s.val_split.empty() ? s.train_split : s.val_split;
  nlohmann::json next = nlohmann::json::object();
  if (!finished) {
    std::vector<std::string> words;
    if (invocation.contains("argv")) words = invocation["argv"].get<std::vector<std::string>>();
    if (words.empty()) words = {"slipstream", "train"};
    const bool named = std::any_of(words.begin(), words.end(),
                                   [](const std::string& w) { return w.rfind("run_id=", 0) == 0; });
    if (!named) words.push_back("run_id=" + s.run_id);
    next["continue"] = shell_command(words);
  }
  next["eval"] = shell_command({"slipstream", "eval", "--checkpoint", model, "--split", split});
  next["infer"] = shell_command({"slipstream", "infer", "--checkpoint", model, "--split", split,
                                 "--out", "predictions/" + s.run_id + "-" + split});
  next["export"] =
      shell_command({"slipstream", "export", "--checkpoint", model, "--out", s.run_id + ".mdlus"});
  if (s.tensorboard) next["tensorboard"] = shell_command({"tensorboard", "--logdir", s.run_dir()});
  j["next"] = next;
  return j;
}

std::string format_run_summary(const nlohmann::json& summary) {
  std::string out;
  char buf[512];
  const bool finished = summary.at("status") == "finished";
  const auto& epochs = summary.at("session_epochs");
  std::snprintf(buf, sizeof buf, "Run %s %s: %lld of %lld epochs done (step %lld); this session %s",
                summary.at("run_id").get<std::string>().c_str(),
                finished
                    ? "finished"
                    : ("stopped by " + summary.value("signal", std::string("a signal"))).c_str(),
                static_cast<long long>(summary.at("epochs_done").get<int64_t>()),
                static_cast<long long>(summary.at("num_epochs").get<int64_t>()),
                static_cast<long long>(summary.at("global_step").get<int64_t>()),
                format_duration(summary.at("session_seconds").get<double>()).c_str());
  out += buf;
  const int64_t first = epochs[0].get<int64_t>();
  if (first > 1) out += " (resumed at epoch " + std::to_string(first) + ")";
  out += "\n";
  if (!summary.at("best").is_null()) {
    const auto& b = summary["best"];
    std::snprintf(buf, sizeof buf, "  best:  val loss %.6g (normalised) at epoch %lld: %s\n",
                  b.at("val_loss").get<double>(),
                  static_cast<long long>(b.at("epoch").get<int64_t>()),
                  b.at("checkpoint").get<std::string>().c_str());
    out += buf;
  } else {
    out += "  best:  none kept (no validation, or training.keep_best=false)\n";
  }
  const std::string last_ckpt = summary.at("last_checkpoint").get<std::string>();
  out +=
      "  last:  " + (last_ckpt.empty() ? std::string("no checkpoint written") : last_ckpt) + "\n";
  out += "  record: " + summary.at("run_dir").get<std::string>() + "/summary.json\n";
  out += "Next:\n";
  for (const char* key : {"continue", "eval", "infer", "export", "tensorboard"}) {
    if (summary["next"].contains(key)) out += "  " + summary["next"][key].get<std::string>() + "\n";
  }
  out += "Run directory: " + summary.at("run_dir").get<std::string>() + "\n";
  return out;
}

}  // namespace slipstream::aero
