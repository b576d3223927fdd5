#include "core/io/staged_directory.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace slipstream {
namespace fs = std::filesystem;

namespace {

bool running(pid_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

// The pid a lock file or a "<name>.<pid>" suffix names; 0 if none.
pid_t pid_in(const std::string& text) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  return end != text.c_str() && v > 0 ? static_cast<pid_t>(v) : 0;
}

}  // namespace

void remove_tree(const std::string& path) {
  std::error_code ec;
  const auto status = fs::symlink_status(path, ec);
  if (ec || !fs::exists(status)) return;
  if (fs::is_directory(status)) {
    std::vector<std::string> entries;
    for (const auto& e : fs::directory_iterator(path)) entries.push_back(e.path().string());
    for (const auto& e : entries) remove_tree(e);
  }
  fs::remove(path, ec);
  TORCH_CHECK(!ec, "cannot remove '", path, "': ", ec.message());
}

StagedDirectory::StagedDirectory(std::string path) : path_(std::move(path)) {
  while (!path_.empty() && path_.size() > 1 && path_.back() == '/') path_.pop_back();
  lock_ = path_ + ".lock";
  const fs::path parent = fs::absolute(path_).parent_path();
  fs::create_directories(parent);
  for (int attempt = 0;; ++attempt) {
    const int fd = open(lock_.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) {
      const std::string pid = std::to_string(getpid()) + "\n";
      const bool ok = write(fd, pid.data(), pid.size()) == static_cast<ssize_t>(pid.size());
      close(fd);
      TORCH_CHECK(ok, "cannot write the lock '", lock_, "'");
      break;
    }
    TORCH_CHECK(errno == EEXIST, "cannot create the lock '", lock_, "': ", std::strerror(errno));
    std::ifstream in(lock_);
    std::string text;
    std::getline(in, text);
    const pid_t holder = pid_in(text);
    TORCH_CHECK(!running(holder) && attempt == 0, "'", path_, "' is being written by process ",
                holder, " (its lock '", lock_,
                "'); wait for it to finish, or remove the lock if that process is not writing it");
    std::remove(lock_.c_str());  // its holder is gone
  }
  // What killed writers left: their staging and set-aside directories.
  const std::string name = fs::path(path_).filename().string();
  for (const auto& e : fs::directory_iterator(parent)) {
    const std::string other = e.path().filename().string();
    for (const char* kind : {".staging.", ".old."}) {
      const std::string prefix = name + kind;
      if (other.rfind(prefix, 0) == 0 && !running(pid_in(other.substr(prefix.size())))) {
        remove_tree(e.path().string());
      }
    }
  }
  staging_ = path_ + ".staging." + std::to_string(getpid());
  try {
    remove_tree(staging_);
    fs::create_directories(staging_);
  } catch (...) {
    std::remove(lock_.c_str());
    throw;
  }
}

StagedDirectory::~StagedDirectory() {
  if (!committed_) {
    try {
      remove_tree(staging_);
    } catch (
        const std::exception&) {  // NOLINT(bugprone-empty-catch): best effort on the error path
    }
  }
  std::remove(lock_.c_str());
}

void StagedDirectory::commit() {
  TORCH_CHECK(!committed_, "'", path_, "' committed twice");
  const std::string aside = path_ + ".old." + std::to_string(getpid());
  const bool had_old = fs::exists(path_);
  if (had_old) {
    TORCH_CHECK(std::rename(path_.c_str(), aside.c_str()) == 0, "cannot move '", path_,
                "' aside to '", aside, "': ", std::strerror(errno));
  }
  if (std::rename(staging_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    if (had_old) std::rename(aside.c_str(), path_.c_str());
    TORCH_CHECK(false, "cannot move '", staging_, "' to '", path_, "': ", std::strerror(err));
  }
  committed_ = true;
  if (had_old) remove_tree(aside);
}

}  // namespace slipstream
