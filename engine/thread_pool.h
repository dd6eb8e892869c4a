// A fixed pool of worker threads that runs one parallel loop at a time.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gcmoe::engine {

class ThreadPool {
 public:
  // `threads` counts the caller too: ThreadPool(1) runs everything on the calling thread.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(task, worker) for task in [0, num_tasks), worker in [0, size()), and returns when
  // all calls have returned. Tasks are handed out dynamically; a worker index is never used by
  // two calls at once, so per-worker scratch needs no lock.
  void ParallelFor(int64_t num_tasks, const std::function<void(int64_t, int)>& fn);

 private:
  void WorkerLoop(int worker);
  void RunTasks(int worker);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t num_tasks_ = 0;
  int64_t next_task_ = 0;   // guarded by mu_
  uint64_t round_ = 0;      // increments per ParallelFor; workers wait for a new round
  int active_ = 0;          // workers still inside the current round
  bool stop_ = false;
};

}  // namespace gcmoe::engine
