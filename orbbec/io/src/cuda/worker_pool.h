// A fixed set of threads that run the jobs of one call at a time: run() hands out job indices
// 0..n-1 and returns when every job is done. The decoder keeps its
// threads for its lifetime, because starting a dozen threads per batch costs more than decoding a
// small batch's headers.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace orbbec {
namespace io {

class WorkerPool {
 public:
  using Job = std::function<void(int worker, size_t job)>;

  // `start(worker)` runs once on each thread before its first job (e.g. cudaSetDevice).
  WorkerPool(int threads, std::function<void(int)> start) {
    for (int w = 0; w < threads; ++w) {
      threads_.emplace_back([this, w, start] {
        start(w);
        loop(w);
      });
    }
  }

  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  int size() const { return static_cast<int>(threads_.size()); }

  // Jobs must not throw: each records its own failure. Returns when every job is done, without
  // waiting for threads that found nothing to do: on a host busy with DataLoader workers a woken
  // thread can wait a time slice before it runs, and a batch with two jobs must not pay for that.
  void run(size_t jobs, const Job& job) {
    if (jobs == 0) return;
    std::unique_lock<std::mutex> lock(mutex_);
    job_ = &job;
    jobs_ = jobs;
    next_ = 0;
    remaining_ = jobs;
    if (jobs >= threads_.size()) {
      wake_.notify_all();
    } else {
      for (size_t k = 0; k < jobs; ++k) wake_.notify_one();
    }
    done_.wait(lock, [this] { return remaining_ == 0; });
    job_ = nullptr;
  }

 private:
  void loop(int w) {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      // Jobs are claimed under the lock, so a thread that wakes late can never take a job of a
      // call that has already returned.
      wake_.wait(lock, [&] { return stopping_ || next_ < jobs_; });
      if (stopping_) return;
      const Job* job = job_;
      const size_t j = next_++;
      lock.unlock();
      (*job)(w, j);
      lock.lock();
      if (--remaining_ == 0) {
        jobs_ = 0;
        done_.notify_one();
      }
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const Job* job_ = nullptr;
  size_t jobs_ = 0, next_ = 0, remaining_ = 0;
  bool stopping_ = false;
};

}  // namespace io
}  // namespace orbbec
