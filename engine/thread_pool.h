// A fixed pool of worker threads that runs parallel loops. Several threads may run loops on one
// pool at once: each loop's tasks go to its caller and to whichever workers are free.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gcmoe::engine {

class ThreadPool {
 public:
  // `threads` counts the caller too: ThreadPool(1) runs everything on the calling thread.
  // A worker that finds no loop spins for `spin` (yielding its core) before it sleeps, so that a
  // loop queued within that time starts on every worker at once instead of after futex wake-ups
  // (tens of microseconds each on a core that has gone idle); a caller whose tasks are all handed
  // out spins as long for the workers still in its loop.
  explicit ThreadPool(int threads, std::chrono::microseconds spin = std::chrono::microseconds(0));
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(task, worker) for task in [0, num_tasks), worker in [0, size()), and returns when
  // all calls have returned. Tasks are handed out dynamically; within one loop a worker index is
  // never used by two calls at once, so per-worker scratch of the loop needs no lock. The caller
  // runs tasks too (as worker 0), so a loop completes even when every worker is busy elsewhere.
  void ParallelFor(int64_t num_tasks, const std::function<void(int64_t, int)>& fn);

 private:
  struct Loop {
    const std::function<void(int64_t, int)>* fn = nullptr;
    int64_t num_tasks = 0;
    std::atomic<int64_t> next{0};
    std::atomic<int> helpers{0};  // workers inside the loop (changed under mu_)
  };
  void WorkerLoop(int worker);
  // Takes a loop whose tasks are all handed out off loops_ (if it is still there): no worker
  // joins it after this.
  void DequeueLocked(Loop* loop);
  static void RunTasks(Loop* loop, int worker);

  const std::chrono::microseconds spin_;
  std::vector<std::thread> workers_;
  std::atomic<int> queued_{0};  // loops_.size(), for spinning workers to read without mu_
  std::mutex mu_;
  std::condition_variable work_cv_;  // a loop was queued, or the pool stops
  std::condition_variable done_cv_;  // a worker left a loop
  std::deque<Loop*> loops_;          // loops that may have tasks left to hand out (under mu_)
  bool stop_ = false;
  int sleeping_ = 0;  // workers waiting on work_cv_ (under mu_)
};

}  // namespace gcmoe::engine
