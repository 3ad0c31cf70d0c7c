// A fixed set of threads that run posted groups of jobs: post() hands out a group's job indices
// 0..n-1 and returns at once; wait() returns when every job of the group is done. Groups run in the
// order they were posted, except that a group posted `first` goes ahead of those not yet started, so
// that one batch's headers and engine submission need not wait behind the previous batch's hybrid
// images (the decoder overlaps two batches). The decoder keeps its threads for its lifetime,
// because starting a dozen threads per batch costs more than decoding a small batch's headers.
#pragma once
#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace orbbec {
namespace io {

class WorkerPool {
 public:
  using Job = std::function<void(int worker, size_t job)>;

  // One post()'s jobs. Its members are read and written under the pool's lock.
  class Group {
    friend class WorkerPool;
    Job job;
    std::function<void()> on_done;
    size_t jobs = 0, next = 0, remaining = 0;
    bool first = false;
  };
  using GroupPtr = std::shared_ptr<Group>;

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

  // Jobs must not throw: each records its own failure. `on_done` runs once every job is done, on
  // the thread that finished the last one (or here when there are none), outside the pool's lock.
  GroupPtr post(size_t jobs, Job job, std::function<void()> on_done = {}, bool first = false) {
    auto g = std::make_shared<Group>();
    g->jobs = g->remaining = jobs;
    if (jobs == 0) {
      if (on_done) on_done();
      return g;
    }
    g->job = std::move(job);
    g->on_done = std::move(on_done);
    g->first = first;
    {
      // `first` groups go ahead of the others but keep their own order among themselves.
      std::lock_guard<std::mutex> lock(mutex_);
      auto at = first ? std::find_if(open_.begin(), open_.end(), [](const GroupPtr& o) { return !o->first; })
                      : open_.end();
      open_.insert(at, g);
    }
    // Wake no more threads than there are jobs: on a host busy with DataLoader workers a woken
    // thread can wait a time slice before it runs, and a batch with two jobs must not pay for that.
    if (jobs >= threads_.size()) {
      wake_.notify_all();
    } else {
      for (size_t k = 0; k < jobs; ++k) wake_.notify_one();
    }
    return g;
  }

  void wait(const GroupPtr& g) {
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [&] { return g->remaining == 0; });
  }

  // post(first) and wait, with the calling thread taking jobs too, as worker size(): one caller at a
  // time (the decoder calls it under its lock), so that a short group (a batch's headers) never
  // waits for a pool thread to come free.
  void run(size_t jobs, const Job& job) {
    if (jobs == 0) return;
    GroupPtr g = post(jobs, job, {}, true);
    std::unique_lock<std::mutex> lock(mutex_);
    while (g->next < g->jobs) {
      const size_t j = claim(g);
      lock.unlock();
      g->job(size(), j);
      lock.lock();
      complete(g, lock);
    }
    finished_.wait(lock, [&] { return g->remaining == 0; });
  }

 private:
  // Takes the next job of g (under the lock); a group leaves the queue with its last job taken.
  size_t claim(const GroupPtr& g) {
    const size_t j = g->next++;
    if (g->next == g->jobs) open_.erase(std::find(open_.begin(), open_.end(), g));
    return j;
  }

  void complete(const GroupPtr& g, std::unique_lock<std::mutex>& lock) {
    if (--g->remaining > 0) return;
    finished_.notify_all();
    // What the jobs and on_done captured is dropped outside the lock too: it may own the memory
    // the jobs wrote, and a destructor may wait for other groups.
    std::function<void()> on_done = std::move(g->on_done);
    Job job = std::move(g->job);
    lock.unlock();
    if (on_done) on_done();
    on_done = nullptr;
    job = nullptr;
    lock.lock();
  }

  void loop(int w) {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      // Jobs are claimed under the lock, so a thread that wakes late can never take a job of a
      // group that is already done.
      wake_.wait(lock, [&] { return stopping_ || !open_.empty(); });
      if (stopping_) return;
      GroupPtr g = open_.front();
      const size_t j = claim(g);
      lock.unlock();
      g->job(w, j);
      lock.lock();
      complete(g, lock);
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  std::deque<GroupPtr> open_;  // groups with jobs not yet taken
  bool stopping_ = false;
};

}  // namespace io
}  // namespace orbbec
