// The thread pool: every task runs once, a worker index is never in two tasks of one loop at
// once, and loops from several threads at once each complete (the coordinator's callers share
// one pool), with sleeping workers and with spinning ones (the coordinator's copy threads).
#include "engine/thread_pool.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace gcmoe::engine {
namespace {

using std::chrono::microseconds;

// Workers that sleep as soon as they are idle, and workers that spin 1 ms first.
constexpr microseconds kSpins[] = {microseconds(0), microseconds(1000)};

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
  for (microseconds spin : kSpins) {
    for (int threads : {1, 2, 4}) {
      ThreadPool pool(threads, spin);
      EXPECT_EQ(pool.size(), threads);
      for (int64_t tasks : {0, 1, 2, 7, 1000}) CheckLoop(&pool, tasks);
    }
  }
}

TEST(ThreadPoolTest, LoopsFromSeveralThreadsAtOnceEachComplete) {
  for (microseconds spin : kSpins) {
    ThreadPool pool(3, spin);
    std::vector<std::thread> callers;
    for (int c = 0; c < 6; ++c) {
      callers.emplace_back([&pool, c] {
        for (int round = 0; round < 50; ++round) CheckLoop(&pool, 1 + (c * 37 + round) % 200);
      });
    }
    for (std::thread& t : callers) t.join();
  }
}

// Two tasks, the first of which waits (up to 10 s) for the second to start: true only if a
// worker joined the caller (run one after the other, the second starts after the first's wait).
bool TwoTasksMeet(ThreadPool* pool) {
  std::atomic<int> arrived{0};
  std::atomic<bool> met{false};
  pool->ParallelFor(2, [&](int64_t, int) {
    if (++arrived > 1) return;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (arrived.load() < 2 && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::yield();
    }
    met.store(arrived.load() == 2);
  });
  return met.load();
}

TEST(ThreadPoolTest, WorkersShareALoop) {
  for (microseconds spin : kSpins) {
    ThreadPool pool(2, spin);
    EXPECT_TRUE(TwoTasksMeet(&pool)) << "the second task ran only after the first returned";
  }
}

TEST(ThreadPoolTest, ASpinningWorkerJoinsALoopItWasNotWokenFor) {
  // With a spin far longer than the test, the worker never sleeps: nothing wakes it, and it must
  // find each loop by itself, the first and one queued after it went back to spinning.
  ThreadPool pool(2, std::chrono::seconds(60));
  EXPECT_TRUE(TwoTasksMeet(&pool)) << "the spinning worker did not join the first loop";
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_TRUE(TwoTasksMeet(&pool)) << "the spinning worker did not join a later loop";
}

}  // namespace
}  // namespace gcmoe::engine
