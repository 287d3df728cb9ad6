#include "ir/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <map>

namespace kiln {

// One ParallelFor call. Workers and the caller claim chunks with an atomic counter; the
// caller waits until every claimed chunk has finished.
struct ThreadPool::Loop {
  const std::function<void(int64_t, int64_t)>* body;
  int64_t n;
  int64_t chunk;
  int64_t num_chunks;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mutex;
  std::condition_variable finished;
  std::exception_ptr error;  // the first chunk's exception (an allocation failure), under `mutex`
};

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerMain(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

ThreadPool& ThreadPool::Shared(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  static std::mutex mutex;
  static auto* pools = new std::map<int, std::unique_ptr<ThreadPool>>();  // never destroyed
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<ThreadPool>& pool = (*pools)[num_threads];
  if (!pool) pool = std::make_unique<ThreadPool>(num_threads);
  return *pool;
}

void ThreadPool::RunChunks(Loop& loop) {
  for (int64_t c = loop.next.fetch_add(1); c < loop.num_chunks; c = loop.next.fetch_add(1)) {
    const int64_t begin = c * loop.chunk;
    try {
      (*loop.body)(begin, std::min(loop.n, begin + loop.chunk));
    } catch (...) {  // rethrown in the calling thread, never std::terminate in a worker
      std::lock_guard<std::mutex> lock(loop.mutex);
      if (!loop.error) loop.error = std::current_exception();
    }
    if (loop.done.fetch_add(1) + 1 == loop.num_chunks) {
      std::lock_guard<std::mutex> lock(loop.mutex);
      loop.finished.notify_all();
    }
  }
}

void ThreadPool::WorkerMain() {
  while (true) {
    std::shared_ptr<Loop> loop;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      loop = std::move(queue_.front());
      queue_.pop_front();
    }
    RunChunks(*loop);
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t min_chunk,
                             const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  // About four chunks per thread balances uneven chunks without much claiming traffic.
  const int64_t wanted = std::max<int64_t>(1, std::min<int64_t>(n / min_chunk, 4 * num_threads()));
  if (wanted == 1 || workers_.empty()) {
    body(0, n);
    return;
  }
  auto loop = std::make_shared<Loop>();
  loop->body = &body;
  loop->n = n;
  loop->chunk = (n + wanted - 1) / wanted;
  loop->num_chunks = (n + loop->chunk - 1) / loop->chunk;
  const int64_t helpers = std::min<int64_t>(static_cast<int64_t>(workers_.size()), loop->num_chunks - 1);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int64_t i = 0; i < helpers; ++i) queue_.push_back(loop);
  }
  if (helpers == 1) {
    wake_.notify_one();
  } else {
    wake_.notify_all();
  }
  RunChunks(*loop);
  std::unique_lock<std::mutex> lock(loop->mutex);
  loop->finished.wait(lock, [&] { return loop->done.load() == loop->num_chunks; });
  if (loop->error) std::rethrow_exception(loop->error);
}

}  // namespace kiln
