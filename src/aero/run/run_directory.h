// RunDirectory: runs/<run_id>/ owned by one run at a time (rank 0 holds it).
//
// Opening it creates it and checkpoints/, takes an exclusive lock on its
// `.lock` file (flock; released by the kernel when the process dies, so a
// kill -9 leaves no stale lock) and checks that checkpoints/ takes a file —
// all before the first step. A second run with the same run_id fails naming
// the pid that holds it.
//
// On a resume, trim_logs() drops from metrics.jsonl (atomically) every record
// after the resumed position and a partial last line a crash left, so that
// no step is logged twice; clear() empties the directory for a run that
// starts over.
#pragma once

#include "aero/run/checkpoint.h"

#include <string>

namespace slipstream::aero {

class RunDirectory {
 public:
  explicit RunDirectory(std::string path);
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  const std::string& path() const { return path_; }
  std::string checkpoints() const { return path_ + "/checkpoints"; }
  std::string metrics() const { return path_ + "/metrics.jsonl"; }

  // Keeps train steps before position.global_step, val steps and summaries
  // of epochs <= position.epochs_done, and every start record.
  void trim_logs(const TrainPosition& position) const;
  // Removes the checkpoints (the best one too), metrics.jsonl, summary.json
  // and the TensorBoard files.
  void clear() const;

 private:
  // Removes "<name>.tmp.<pid>" files under the run and its checkpoints
  // whose writer is no longer alive (killed mid-write), saying so.
  void remove_stale_temp_files() const;
  std::string path_;
  int lock_fd_ = -1;
};

// Whether a live process holds the run directory at `path` (its .lock).
bool run_directory_in_use(const std::string& path);

// Throws unless `run_id` is a plain name: non-empty, no path separator, not
// "." or "..", not starting with '.'.
void check_run_id(const std::string& run_id);

}  // namespace slipstream::aero
