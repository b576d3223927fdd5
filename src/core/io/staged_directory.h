// A directory replaced whole or not at all, by one writer at a time.
//
// StagedDirectory(path) takes "<path>.lock" (O_EXCL, holding this pid; a
// lock whose pid is no longer running is taken over) and creates the empty
// staging directory "<path>.staging.<pid>", where the caller writes. commit()
// swaps it in: the old <path>, if any, is renamed aside, the staging
// directory renamed to <path>, and the old one removed. Destroyed without
// commit() (an error on the way), it removes the staging directory and
// leaves <path> as it was. Either way the lock is released. Leftovers of a
// writer that was killed (its staging or set-aside directory) are removed
// when the next one starts.
//
// The directories are flat or nearly so; removal walks them itself (a
// LibTorch build's own std::filesystem::remove_all crashed when called from
// our code).
#pragma once

#include <string>

namespace slipstream {

class StagedDirectory {
 public:
  // Throws c10::Error naming the lock's holder when another live process
  // holds it.
  explicit StagedDirectory(std::string path);
  ~StagedDirectory();
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;

  const std::string& staging() const { return staging_; }
  void commit();

 private:
  std::string path_, lock_, staging_;
  bool committed_ = false;
};

// Removes a file or a directory and everything under it; missing is fine.
// Throws c10::Error naming what could not be removed.
void remove_tree(const std::string& path);

}  // namespace slipstream
