#include "engine/thread_pool.h"

#include <algorithm>

#include "common/spin_wait.h"

namespace gcmoe::engine {

ThreadPool::ThreadPool(int threads, std::chrono::microseconds spin) : spin_(spin) {
  for (int w = 1; w < threads; ++w) workers_.emplace_back([this, w] { WorkerLoop(w); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queued_.fetch_add(1, std::memory_order_release);  // ends the spins
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunTasks(Loop* loop, int worker) {
  for (;;) {
    const int64_t task = loop->next.fetch_add(1, std::memory_order_relaxed);
    if (task >= loop->num_tasks) return;
    (*loop->fn)(task, worker);
  }
}

void ThreadPool::DequeueLocked(Loop* loop) {
  const auto it = std::find(loops_.begin(), loops_.end(), loop);
  if (it == loops_.end()) return;
  loops_.erase(it);
  queued_.fetch_sub(1, std::memory_order_relaxed);
}

void ThreadPool::WorkerLoop(int worker) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (loops_.empty() && !stop_ && spin_.count() > 0) {
      lock.unlock();
      SpinUntil([this] { return queued_.load(std::memory_order_acquire) > 0; }, spin_);
      lock.lock();
    }
    ++sleeping_;
    work_cv_.wait(lock, [this] { return stop_ || !loops_.empty(); });
    --sleeping_;
    if (stop_) return;
    Loop* loop = loops_.front();
    ++loop->helpers;
    lock.unlock();
    RunTasks(loop, worker);
    lock.lock();
    DequeueLocked(loop);
    if (--loop->helpers == 0) done_cv_.notify_all();
  }
}

void ThreadPool::ParallelFor(int64_t num_tasks, const std::function<void(int64_t, int)>& fn) {
  if (num_tasks <= 0) return;
  if (workers_.empty() || num_tasks == 1) {
    for (int64_t t = 0; t < num_tasks; ++t) fn(t, 0);
    return;
  }
  Loop loop;
  loop.fn = &fn;
  loop.num_tasks = num_tasks;
  int64_t wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    loops_.push_back(&loop);
    queued_.fetch_add(1, std::memory_order_release);
    // One worker per task beyond the caller's first; spinning workers see the loop themselves.
    wake = std::min<int64_t>(num_tasks - 1, sleeping_);
  }
  for (int64_t i = 0; i < wake; ++i) work_cv_.notify_one();
  RunTasks(&loop, 0);
  std::unique_lock<std::mutex> lock(mu_);
  DequeueLocked(&loop);
  if (spin_.count() > 0 && loop.helpers.load(std::memory_order_relaxed) > 0) {
    // The workers' last tasks end soon; blocking now would add this thread's own wake-up.
    lock.unlock();
    SpinUntil([&loop] { return loop.helpers.load(std::memory_order_acquire) == 0; }, spin_);
    lock.lock();
  }
  done_cv_.wait(lock, [&loop] { return loop.helpers.load(std::memory_order_relaxed) == 0; });
}

}  // namespace gcmoe::engine
