// A fixed set of threads that run the jobs of one call at a time: run() hands out job indices
// 0..n-1 through an atomic counter and returns when every job is done. The decoder keeps its
// threads for its lifetime, because starting a dozen threads per batch costs more than decoding a
// small batch's headers.
#pragma once
#include <atomic>
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

  // Jobs must not throw: each records its own failure.
  void run(size_t jobs, const Job& job) {
    if (jobs == 0) return;
    std::unique_lock<std::mutex> lock(mutex_);
    job_ = &job;
    jobs_ = jobs;
    next_.store(0);
    busy_ = static_cast<int>(threads_.size());
    ++generation_;
    wake_.notify_all();
    done_.wait(lock, [this] { return busy_ == 0; });
    job_ = nullptr;
  }

 private:
  void loop(int w) {
    size_t seen = 0;
    for (;;) {
      const Job* job;
      size_t jobs;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
        job = job_;
        jobs = jobs_;
      }
      for (size_t j = next_.fetch_add(1); j < jobs; j = next_.fetch_add(1)) (*job)(w, j);
      std::lock_guard<std::mutex> lock(mutex_);
      if (--busy_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const Job* job_ = nullptr;
  size_t jobs_ = 0;
  std::atomic<size_t> next_{0};
  int busy_ = 0;
  size_t generation_ = 0;
  bool stopping_ = false;
};

}  // namespace io
}  // namespace orbbec
