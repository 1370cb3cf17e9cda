// ThreadPool: coverage, chunking, concurrency of many callers, reentrancy.
#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tokensel::kernels::cpu {
namespace {

// How long a test waits for an event that a working pool makes happen at
// once: only a broken pool (or a hung machine) reaches it.
constexpr auto kGenerous = std::chrono::seconds(30);

void ExpectCoversOnce(ThreadPool* pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  ParallelFor(pool, n, grain, [&](int64_t begin, int64_t end) {
    ASSERT_LE(0, begin);
    ASSERT_LT(begin, end);
    ASSERT_LE(end, n);
    for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
}

TEST(ThreadPoolTest, EveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1001}) {
      for (int64_t grain : {1, 3, 1000, 5000}) ExpectCoversOnce(&pool, n, grain);
    }
  }
  ExpectCoversOnce(nullptr, 17, 1);
}

// Two chunks meet: each chunk waits until another one is running at the same
// time, so the test passes only if chunks really run concurrently (no sleep
// that a loaded machine could outlast). A serial pool fails after one
// deadline; later chunks no longer wait.
TEST(ThreadPoolTest, UsesWorkersWhenWorkIsLarge) {
  ThreadPool pool(4);
  std::mutex mu;
  std::condition_variable cv;
  int running = 0;
  bool met = false;
  bool gave_up = false;
  pool.ParallelFor(64, 1, [&](int64_t, int64_t) {
    std::unique_lock<std::mutex> lock(mu);
    if (++running >= 2) met = true;
    cv.notify_all();
    if (!cv.wait_for(lock, kGenerous, [&] { return met || gave_up; })) gave_up = true;
    --running;
  });
  EXPECT_TRUE(met) << "no two chunks ever ran at the same time";
}

TEST(ThreadPoolTest, ManyConcurrentCallersShareOnePool) {
  ThreadPool pool(3);
  std::vector<std::thread> callers;
  std::atomic<int64_t> total{0};
  for (int c = 0; c < 8; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep) {
        std::atomic<int64_t> sum{0};
        pool.ParallelFor(500, 7, [&](int64_t b, int64_t e) {
          int64_t local = 0;
          for (int64_t i = b; i < e; ++i) local += i;
          sum.fetch_add(local);
        });
        ASSERT_EQ(sum.load(), 500 * 499 / 2);
        total.fetch_add(1);
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 8 * 50);
}

TEST(ThreadPoolTest, NestedParallelForCompletes) {
  ThreadPool pool(2);
  std::atomic<int64_t> count{0};
  pool.ParallelFor(8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.ParallelFor(16, 1, [&](int64_t b2, int64_t e2) { count.fetch_add(e2 - b2); });
    }
  });
  EXPECT_EQ(count.load(), 8 * 16);
}

// An allocation failure inside a chunk reaches the caller as an exception,
// whichever thread ran the chunk, and the pool goes on working.
TEST(ThreadPoolTest, AChunksExceptionIsRethrownToTheCaller) {
  ThreadPool pool(3);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> worker_throws{0};
  const auto deadline = std::chrono::steady_clock::now() + kGenerous;
  for (int round = 0; round < 50; ++round) {
    bool thrown = false;
    try {
      // Every chunk throws, on whichever thread runs it; until some worker
      // has thrown, a chunk on the calling thread first waits for one (an
      // event, not a sleep: a loaded machine may not run a worker within any
      // fixed time). While the caller waits, the other chunks can only go to
      // the workers. (Waiting in chunk 0 instead could wait for nothing: a
      // worker may take chunk 0 while the caller throws on chunk 1, and then
      // no other chunk runs.)
      pool.ParallelFor(1 << 12, 1, [&](int64_t, int64_t) {
        if (std::this_thread::get_id() == caller) {
          while (worker_throws.load() == 0 && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::yield();
          }
        } else {
          ++worker_throws;
        }
        throw std::bad_alloc();
      });
    } catch (const std::bad_alloc&) {
      thrown = true;
    }
    EXPECT_TRUE(thrown) << "round " << round;
    ExpectCoversOnce(&pool, 1000, 7);  // still usable
  }
  EXPECT_GT(worker_throws.load(), 0) << "no chunk ran on a worker: the test proved nothing";
}

}  // namespace
}  // namespace tokensel::kernels::cpu
