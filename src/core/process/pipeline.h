// Three stages over items 0..n-1, overlapped: read(i) on a thread of its
// own, at most `depth` items ahead of work; work(i, item) on the calling
// thread; write(i, item) on a thread of its own, at most `depth` items
// behind. Each stage sees the items in order, one at a time, so a stage
// may keep state from one item to the next (a file cursor, a writer).
//
// The first exception any stage throws stops all three (the other two
// stop at their next item; none is left waiting) and is rethrown here once
// both threads have ended. Nothing runs after a failure: no later item is
// read, worked on or written.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>

namespace slipstream {

template <class T>
void run_pipeline(int64_t n, size_t depth, const std::function<T(int64_t)>& read,
                  const std::function<void(int64_t, T&)>& work,
                  const std::function<void(int64_t, T&)>& write) {
  if (depth == 0) throw std::invalid_argument("run_pipeline: depth must be at least 1");
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<T> to_work, to_write;  // each at most `depth` long
  bool work_done = false, failed = false;
  std::exception_ptr error;
  const auto fail = [&](std::exception_ptr e) {
    const std::lock_guard<std::mutex> lock(mutex);
    if (!error) error = std::move(e);
    failed = true;
    changed.notify_all();
  };
  // Waits until `ready` or a failure; false on a failure.
  const auto wait_for = [&](std::unique_lock<std::mutex>& lock, const auto& ready) {
    changed.wait(lock, [&] { return failed || ready(); });
    return !failed;
  };

  std::thread reader([&] {
    try {
      for (int64_t i = 0; i < n; ++i) {
        {
          std::unique_lock<std::mutex> lock(mutex);
          if (!wait_for(lock, [&] { return to_work.size() < depth; })) return;
        }
        T item = read(i);
        const std::lock_guard<std::mutex> lock(mutex);
        to_work.push_back(std::move(item));
        changed.notify_all();
      }
    } catch (...) {
      fail(std::current_exception());
    }
  });
  std::thread writer([&] {
    try {
      for (int64_t i = 0;; ++i) {
        std::optional<T> item;
        {
          std::unique_lock<std::mutex> lock(mutex);
          if (!wait_for(lock, [&] { return !to_write.empty() || work_done; })) return;
          if (to_write.empty()) return;  // work is done and everything is written
          item.emplace(std::move(to_write.front()));
          to_write.pop_front();
          changed.notify_all();
        }
        write(i, *item);
      }
    } catch (...) {
      fail(std::current_exception());
    }
  });
  try {
    for (int64_t i = 0; i < n; ++i) {
      std::optional<T> item;
      {
        std::unique_lock<std::mutex> lock(mutex);
        if (!wait_for(lock, [&] { return !to_work.empty(); })) break;
        item.emplace(std::move(to_work.front()));
        to_work.pop_front();
        changed.notify_all();
      }
      work(i, *item);
      std::unique_lock<std::mutex> lock(mutex);
      if (!wait_for(lock, [&] { return to_write.size() < depth; })) break;
      to_write.push_back(std::move(*item));
      changed.notify_all();
    }
  } catch (...) {
    fail(std::current_exception());
  }
  {
    const std::lock_guard<std::mutex> lock(mutex);
    work_done = true;
    changed.notify_all();
  }
  reader.join();
  writer.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace slipstream
