#include "aero/run/run_directory.h"

#include "core/io/atomic_file.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace slipstream::aero {

namespace fs = std::filesystem;

void check_run_id(const std::string& id) {
  const bool control = std::any_of(id.begin(), id.end(), [](char c) {
    return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
  });
  TORCH_CHECK(!control, "config: run_id must not hold control characters (a newline, a tab, ...)");
  TORCH_CHECK(!id.empty() && id.find('/') == std::string::npos &&
                  id.find('\\') == std::string::npos && id.front() != '.',
              "config: run_id '", id,
              "' must be a plain name (no '/', not '.' or '..', not starting with '.'): it names "
              "a directory inside output_dir");
}

void RunDirectory::remove_stale_temp_files() const {
  for (const std::string& dir : {path_, checkpoints()}) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      const auto at = name.rfind(".tmp.");
      if (at == std::string::npos || !entry.is_regular_file(ec)) continue;
      const std::string digits = name.substr(at + 5);
      if (digits.empty() || digits.size() > 9 ||
          !std::all_of(digits.begin(), digits.end(), ::isdigit)) {
        continue;
      }
      // The writer died before its rename (write_file_atomically's temp
      // name ends in its pid); a live one is left alone.
      const pid_t writer = static_cast<pid_t>(std::stol(digits));
      if (::kill(writer, 0) == 0 || errno != ESRCH) continue;
      if (fs::remove(entry.path(), ec)) {
        std::fprintf(stderr, "run: removed '%s', left by a writer (pid %d) that died mid-write\n",
                     entry.path().c_str(), static_cast<int>(writer));
      }
    }
  }
}

RunDirectory::RunDirectory(std::string path) : path_(std::move(path)) {
  std::error_code ec;
  fs::create_directories(checkpoints(), ec);
  TORCH_CHECK(!ec, "run: cannot create '", checkpoints(), "': ", ec.message());
  const std::string lock = path_ + "/.lock";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  TORCH_CHECK(lock_fd_ >= 0, "run: cannot open '", lock, "': ", std::strerror(errno));
  if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    char holder[32] = {};
    const ssize_t n = pread(lock_fd_, holder, sizeof(holder) - 1, 0);
    ::close(lock_fd_);
    lock_fd_ = -1;
    TORCH_CHECK(false, "run: '", path_, "' is in use by another run (pid ",
                n > 0 ? std::string(holder, static_cast<size_t>(n)) : std::string("unknown"),
                " holds ", lock, "); give this run another run_id");
  }
  const std::string pid = std::to_string(getpid());
  if (ftruncate(lock_fd_, 0) != 0 || pwrite(lock_fd_, pid.data(), pid.size(), 0) < 0) {
    // The lock holds without the pid in it; only the message names less.
  }
  remove_stale_temp_files();
  // checkpoints/ must take a file before the first step, not after an epoch.
  const std::string probe = checkpoints() + "/.write_probe";
  try {
    write_file_atomically(probe, "ok\n");
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "run: checkpoints cannot be written to '", checkpoints(),
                "' (found before the first step): ", e.what_without_backtrace());
  }
  std::remove(probe.c_str());
}

bool run_directory_in_use(const std::string& path) {
  const std::string lock = path + "/.lock";
  const int fd = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = flock(fd, LOCK_SH | LOCK_NB) != 0;
  ::close(fd);  // releases the shared lock when it was taken
  return held;
}

RunDirectory::~RunDirectory() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

namespace {

// The record's phase and its position fields, or an empty phase when the
// line is not a whole JSON record (a crash's partial last line).
struct Line {
  std::string phase;
  int64_t global_step = -1, epoch = -1;
};

Line parse(const std::string& text) {
  Line l;
  try {
    const auto j = nlohmann::json::parse(text);
    if (!j.is_object() || !j.contains("phase")) return l;
    l.phase = j["phase"].get<std::string>();
    if (j.contains("global_step") && j["global_step"].is_number()) {
      l.global_step = j["global_step"].get<int64_t>();
    }
    if (j.contains("epoch") && j["epoch"].is_number()) l.epoch = j["epoch"].get<int64_t>();
  } catch (const std::exception&) {
    l.phase.clear();
  }
  return l;
}

}  // namespace

void RunDirectory::trim_logs(const TrainPosition& pos) const {
  std::ifstream in(metrics());
  if (!in.good()) return;
  std::string kept, text;
  bool dropped = false;
  while (std::getline(in, text)) {
    const Line l = parse(text);
    bool keep = !l.phase.empty();
    if (l.phase == "train_step") keep = l.global_step >= 0 && l.global_step < pos.global_step;
    if (l.phase == "val_step" || l.phase == "train_summary" || l.phase == "val_summary") {
      keep = l.epoch >= 0 && l.epoch <= pos.epochs_done;
    }
    if (keep) {
      kept += text + "\n";
    } else {
      dropped = true;
    }
  }
  in.close();
  if (dropped) write_file_atomically(metrics(), kept);
}

void RunDirectory::clear() const {
  for (const auto& f : list_checkpoints(checkpoints())) std::remove(f.c_str());
  std::remove((checkpoints() + "/" + kBestCheckpointName).c_str());
  std::remove(metrics().c_str());
  std::remove((path_ + "/summary.json").c_str());
  for (const char* sub : {"/tb/train", "/tb/val"}) {
    std::error_code ec;
    if (!fs::is_directory(path_ + sub, ec)) continue;
    for (const auto& e : fs::directory_iterator(path_ + sub)) std::remove(e.path().c_str());
  }
}

}  // namespace slipstream::aero
