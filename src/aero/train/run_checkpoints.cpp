#include "aero/train/run_checkpoints.h"

#include "core/process/stop_signal.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace slipstream::aero {

namespace fs = std::filesystem;

std::vector<std::string> meaning_differences(const std::map<std::string, std::string>& checkpoint,
                                             const std::map<std::string, std::string>& run) {
  // What the weights mean: which fields they predict, in which order and
  // units (statistics, nondimensionalisation), from which inputs, after which
  // transforms, at which precision, in which model. The schedule, the
  // logging and the device may change on a resume; these may not.
  static const std::vector<std::pair<const char*, const char*>> keys = {
      {"fields", "the target fields (their order, statistics or nondimensionalisation)"},
      {"inputs", "the model's inputs (their order or their sources)"},
      {"transforms", "the sample transforms (dataset.transforms.center, scale_by_L_ref)"},
      {"precision", "the precision"},
      {"model", "the model"},
      {"model_shape", "the model's input and output widths"}};
  std::vector<std::string> out;
  for (const auto& [key, what] : keys) {
    const auto c = checkpoint.find(key);
    const auto r = run.find(key);
    if (c == checkpoint.end() || r == run.end()) continue;  // not recorded by older versions
    bool same = c->second == r->second;
    if (!same) {
      // The same JSON written another way is the same meaning.
      try {
        same = nlohmann::json::parse(c->second) == nlohmann::json::parse(r->second);
      } catch (const std::exception&) {
      }
    }
    if (!same) {
      out.push_back(std::string(what) + ": the checkpoint has " + c->second + ", this config has " +
                    r->second);
    }
  }
  return out;
}

namespace {

// A mismatch's message led by the model and optimizer keys in which the
// checkpoint's own config (its "config" metadata) and `config` differ, its
// list of tensors cut to a few lines when those keys say it.
std::string with_config_differences(const std::string& message, const std::string& path,
                                    const Config& config) {
  std::map<std::string, std::string> theirs;
  try {
    const auto meta = load_checkpoint(path, nullptr, nullptr).metadata;
    if (meta.count("config")) theirs = Config::parse_resolved(meta.at("config"), path).flat();
  } catch (const std::exception&) {
    return message;
  }
  if (theirs.empty()) return message;
  const auto ours = config.flat();
  std::vector<std::string> keys;
  auto counts = [](const std::string& k) {
    return k.rfind("model.", 0) == 0 || k.rfind("optimizer.", 0) == 0;
  };
  for (const auto& [k, v] : ours) {
    if (!counts(k)) continue;
    const auto it = theirs.find(k);
    if (it == theirs.end()) {
      keys.push_back(k + ": " + v + " now, absent in the checkpoint's config");
    } else if (it->second != v) {
      keys.push_back(k + ": " + it->second + " in the checkpoint, " + v + " now");
    }
  }
  for (const auto& [k, v] : theirs) {
    if (counts(k) && !ours.count(k))
      keys.push_back(k + ": " + v + " in the checkpoint, absent now");
  }
  if (keys.empty()) return message;
  std::string out = "checkpoint: '" + path + "' was written with another config; it differs in:";
  for (const auto& k : keys) out += "\n  " + k;
  // The tensors that follow from it: the first few.
  std::istringstream lines(message);
  std::string line, tensors;
  int shown = 0, more = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("  ", 0) != 0) continue;
    if (shown < 3) {
      tensors += "\n" + line;
      ++shown;
    } else {
      ++more;
    }
  }
  if (!tensors.empty()) {
    out += "\nso its tensors differ:" + tensors;
    if (more > 0) out += "\n  ... and " + std::to_string(more) + " more";
  }
  return out +
         "\nNothing was loaded or overwritten. Resume with the config it was written with "
         "(resolved_config.yaml beside it), or train under another run_id.";
}

}  // namespace

TrainPosition resume_position(Run& run, RunDirectory* dir) {
  const auto& s = run.settings();
  const std::string ckpt = s.run_dir() + "/checkpoints";
  const auto existing = list_checkpoints(ckpt);
  if (s.start_over || (!s.resume && !existing.empty())) {
    TORCH_CHECK(s.start_over, "run: '", s.run_dir(),
                "' has checkpoints (newest: ", existing.empty() ? "" : existing.front(),
                ") and training.resume=false would overwrite them; set training.start_over=true "
                "to discard them and the logs, or give this run another run_id");
    if (dir != nullptr) dir->clear();
    return {};
  }
  if (!s.resume) return {};
  std::optional<CheckpointInfo> info;
  try {
    info = load_newest_checkpoint(ckpt, run.model.get(), run.optimizer.get());
  } catch (const CheckpointMismatch& e) {
    throw CheckpointMismatch(with_config_differences(e.what(), existing.front(), run.config));
  }
  if (!info) {
    // A fresh start, perhaps after a crash before the first checkpoint: the
    // steps it logged are trained again.
    if (dir != nullptr) dir->trim_logs(TrainPosition{});
    return {};
  }
  const auto differences = meaning_differences(info->metadata, run.checkpoint_metadata());
  if (!differences.empty()) {
    std::string list;
    for (const auto& d : differences) list += "\n  " + d;
    throw CheckpointMismatch("checkpoint: '" + info->path +
                             "' was trained on data of another meaning; " +
                             std::to_string(differences.size()) + " difference(s):" + list +
                             "\nNothing was overwritten. Resume with the config it was written "
                             "with (the checkpoint holds it: its 'config' metadata), or train "
                             "under another run_id.");
  }
  const TrainPosition& p = info->position;
  if (run.rank == 0) {
    std::cout << "Resumed from " << info->path << " (" << p.epochs_done << " epochs and "
              << p.steps_into_epoch << " steps of the next done, step " << p.global_step << ")\n";
  }
  if (dir != nullptr) dir->trim_logs(p);
  return p;
}

namespace {

constexpr const char* kValLossKey = "val_loss";

// Makes `best` name the same file as `path` (a hard link; a copy where the
// file system has none), replacing the old one only once the new is whole.
void link_best(const std::string& path, const std::string& best) {
  const std::string tmp = best + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  fs::remove(tmp, ec);
  fs::create_hard_link(path, tmp, ec);
  if (ec) {
    ec.clear();
    fs::copy_file(path, tmp, ec);
    TORCH_CHECK(!ec, "checkpoint: cannot keep '", path, "' as '", best, "': ", ec.message());
  }
  fs::rename(tmp, best, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    TORCH_CHECK(false, "checkpoint: cannot keep '", path, "' as '", best, "': ", ec.message());
  }
}

}  // namespace

std::optional<BestCheckpoint> best_checkpoint(const std::string& checkpoints_dir) {
  const std::string path = checkpoints_dir + "/" + kBestCheckpointName;
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  try {
    const CheckpointInfo info = load_checkpoint(path, nullptr, nullptr);
    const auto loss = info.metadata.find(kValLossKey);
    if (loss == info.metadata.end()) return std::nullopt;
    return BestCheckpoint{path, info.position.epochs_done, std::stod(loss->second)};
  } catch (const std::exception& e) {
    std::cerr << "checkpoint: '" << path << "' is not a whole checkpoint (" << e.what()
              << "); the next validated epoch replaces it\n";
    return std::nullopt;
  }
}

std::string save_run_checkpoint(Run& run, const TrainPosition& position,
                                std::optional<double> val_loss) {
  if (run.rank != 0) return {};
  const auto& s = run.settings();
  const std::string dir = s.run_dir() + "/checkpoints";
  auto metadata = run.checkpoint_metadata();
  const bool scored = val_loss && std::isfinite(*val_loss);
  if (scored) {
    char text[40];
    std::snprintf(text, sizeof text, "%.17g", *val_loss);
    metadata[kValLossKey] = text;
  }
  std::string path = save_checkpoint(dir, position, *run.model, *run.optimizer, metadata);
  if (s.keep_best && scored) {
    const auto best = best_checkpoint(dir);
    if (!best || *val_loss < best->val_loss) link_best(path, dir + "/" + kBestCheckpointName);
  }
  prune_checkpoints(dir, s.keep_last);  // only once the new one is in place
  return path;
}

std::string find_unfinished_run(const std::string& output_dir, const Config& config,
                                int64_t num_epochs) {
  auto without_run_id = [](nlohmann::json j) {
    j.erase("run_id");
    return j;
  };
  const nlohmann::json wanted = without_run_id(config.to_json());
  std::string found;
  fs::file_time_type found_time{};
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) {
    const std::string run_dir = entry.path().string();
    const std::string resolved = run_dir + "/resolved_config.yaml";
    std::error_code e2;
    if (!entry.is_directory(e2) || !fs::exists(resolved, e2)) continue;
    try {
      if (without_run_id(Config::load_resolved(resolved).to_json()) != wanted) continue;
    } catch (const std::exception&) {
      continue;  // not a config of this version: not this run
    }
    const auto files = list_checkpoints(run_dir + "/checkpoints");
    if (files.empty() || run_directory_in_use(run_dir)) continue;
    std::optional<TrainPosition> newest;
    for (const auto& f : files) {  // the newest good one, as a resume takes it
      try {
        newest = load_checkpoint(f, nullptr, nullptr).position;
        break;
      } catch (const std::exception&) {
      }
    }
    if (!newest || (newest->epochs_done >= num_epochs && newest->steps_into_epoch == 0)) continue;
    const auto time = fs::last_write_time(files.front(), e2);
    if (e2) continue;
    if (found.empty() || time > found_time) {
      found = entry.path().filename().string();
      found_time = time;
    }
  }
  return found;
}

bool any_rank_requests_stop(Run& run) {
  double stop = StopSignals::requested() != 0 ? 1.0 : 0.0;
  if (run.comm && run.world_size > 1) {
    auto t =
        torch::full({1}, stop, torch::TensorOptions().dtype(torch::kDouble).device(run.device));
    run.comm->all_reduce_max(t);
    stop = t.item<double>();
  }
  return stop > 0;
}

}  // namespace slipstream::aero
