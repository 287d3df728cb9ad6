// A fixed pool of worker threads for data-parallel loops. Threads are created once and
// reused (ThreadPool::Shared), so a graph evaluation does not pay for thread start-up per
// op. ParallelFor is safe to call from several threads at once and from inside a
// ParallelFor body: the calling thread always works on its own loop, so it never waits
// on workers that are busy elsewhere.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

class ThreadPool {
 public:
  // `num_threads` counts the calling thread: 1 runs everything inline; 0 means
  // std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // A process-wide pool per thread count, created on first use and never destroyed.
  static ThreadPool& Shared(int num_threads);

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls body(begin, end) on disjoint chunks covering [0, n), each at least `min_chunk`
  // long (but the last), and returns when all are done. Chunk boundaries depend only on
  // n, min_chunk and num_threads(), never on timing. An exception a chunk throws (an
  // allocation failure) is rethrown here, in the calling thread, once every chunk is done,
  // so it reaches the command's handler instead of ending the process from a worker.
  void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& body);

 private:
  struct Loop;
  void WorkerMain();
  static void RunChunks(Loop& loop);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Loop>> queue_;  // one entry per worker invited to a loop
  bool stopping_ = false;
};

}  // namespace kiln
