// The thread pool: every task runs once, a worker index is never in two tasks of one loop at
// once, and loops from several threads at once each complete (the coordinator's callers share
// one pool).
#include "engine/thread_pool.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace gcmoe::engine {
namespace {

// Runs a loop of `tasks` tasks and checks it: each task once, each worker index in range and in
// one task at a time.
void CheckLoop(ThreadPool* pool, int64_t tasks) {
  std::vector<std::atomic<int>> runs(static_cast<size_t>(tasks));
  std::vector<std::atomic<int>> inside(static_cast<size_t>(pool->size()));
  std::atomic<int> overlaps{0};
  std::atomic<int> bad_worker{0};
  pool->ParallelFor(tasks, [&](int64_t task, int worker) {
    if (worker < 0 || worker >= pool->size()) {
      ++bad_worker;
      return;
    }
    if (inside[worker].fetch_add(1) != 0) ++overlaps;
    runs[static_cast<size_t>(task)].fetch_add(1);
    std::this_thread::yield();
    inside[worker].fetch_sub(1);
  });
  EXPECT_EQ(bad_worker.load(), 0);
  EXPECT_EQ(overlaps.load(), 0);
  for (int64_t t = 0; t < tasks; ++t) ASSERT_EQ(runs[static_cast<size_t>(t)].load(), 1) << t;
}

TEST(ThreadPoolTest, RunsEveryTaskOnceWithWorkerIndicesOfTheirOwn) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t tasks : {0, 1, 2, 7, 1000}) CheckLoop(&pool, tasks);
  }
}

TEST(ThreadPoolTest, LoopsFromSeveralThreadsAtOnceEachComplete) {
  ThreadPool pool(3);
  std::vector<std::thread> callers;
  for (int c = 0; c < 6; ++c) {
    callers.emplace_back([&pool, c] {
      for (int round = 0; round < 50; ++round) CheckLoop(&pool, 1 + (c * 37 + round) % 200);
    });
  }
  for (std::thread& t : callers) t.join();
}

TEST(ThreadPoolTest, WorkersShareALoop) {
  // Tasks that wait until two run at once finish only if a worker joins the caller.
  ThreadPool pool(2);
  std::atomic<int> arrived{0};
  std::atomic<bool> met{false};
  pool.ParallelFor(2, [&](int64_t, int) {
    ++arrived;
    for (int i = 0; i < 2000000 && arrived.load() < 2; ++i) std::this_thread::yield();
    if (arrived.load() == 2) met.store(true);
  });
  EXPECT_TRUE(met.load()) << "the second task ran only after the first returned";
}

}  // namespace
}  // namespace gcmoe::engine
