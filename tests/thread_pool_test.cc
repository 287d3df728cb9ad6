// ir/thread_pool.h: chunks cover the range once, and an exception thrown in a worker's
// chunk (an allocation failure deep inside the reference backend) reaches the caller.
#include "ir/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <new>
#include <vector>

namespace kiln {
namespace {

TEST(ThreadPool, ChunksCoverTheRangeOnce) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(1000);
  pool.ParallelFor(1000, 10, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) ++hits[i];
  });
  for (const std::atomic<int>& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, AnAllocationFailureInAnyChunkIsRethrownInTheCaller) {
  ThreadPool pool(4);
  for (int64_t failing = 0; failing < 16; ++failing) {  // the first chunk (the caller's) to the last
    std::atomic<int64_t> ran{0};
    EXPECT_THROW(pool.ParallelFor(16, 1,
                                  [&](int64_t begin, int64_t end) {
                                    ran += end - begin;
                                    if (begin <= failing && failing < end) throw std::bad_alloc();
                                  }),
                 std::bad_alloc)
        << failing;
    EXPECT_EQ(ran.load(), 16) << "every other chunk still ran before the rethrow";
  }
  // The pool is still usable afterwards.
  std::atomic<int64_t> sum{0};
  pool.ParallelFor(100, 1, [&](int64_t begin, int64_t end) { sum += end - begin; });
  EXPECT_EQ(sum.load(), 100);
}

}  // namespace
}  // namespace kiln
