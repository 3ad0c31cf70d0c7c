// One background thread that runs queued calls in the order they were queued, each in two steps:
// begin, which starts the call's work elsewhere (the GPU decoder's threads) and returns its finish,
// and finish, which waits for that work and delivers the result. The thread runs a call's finish
// once the next call has begun, or once the call reports (through `ready`) that its work is done,
// whichever comes first, so that the decoder's threads go on from one batch's images to the next
// batch's instead of idling while a batch ends. The GPU decoder's asynchronous entry
// (decode_jpeg_cuda_start) queues each batch here: the caller's Python prepares the next batch or
// finishes the last meanwhile, and batches still reach the decoder (and the caller's stream) in the
// order they were started.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace orbbec {
namespace io {

class CallThread {
 public:
  using Finish = std::function<void()>;
  // Gets `ready`, to be called (from any thread) once finish would not wait; returns the finish
  // (empty: nothing to finish). Neither step may throw: each delivers its own failure.
  using Begin = std::function<Finish(std::function<void()> ready)>;

  CallThread() : thread_([this] { loop(); }) {}

  ~CallThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }

  void submit(Begin begin) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(begin));
    }
    wake_.notify_one();
  }

  // Whether a call's finish may wait for the next call's begin; ORBBEC_NVJPEG_OVERLAP=0 (read when
  // the thread starts): each call finishes before the next begins (for comparison).
  bool overlaps() const { return overlap_; }

 private:
  struct Pending {
    Finish finish;
    std::shared_ptr<std::atomic<bool>> ready;
  };

  void loop() {
    Pending pending;
    for (;;) {
      Begin next;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] {
          return stop_ || !queue_.empty() || (pending.finish && pending.ready->load());
        });
        if (!queue_.empty()) {
          next = std::move(queue_.front());
          queue_.pop_front();
        } else if (!pending.finish) {
          return;  // stopping, and nothing left to run
        }
      }
      if (next) {
        Pending begun;
        begun.ready = std::make_shared<std::atomic<bool>>(false);
        // Notified under the lock: `ready` may come after the call was finished for another reason.
        begun.finish = next([this, flag = begun.ready] {
          std::lock_guard<std::mutex> lock(mutex_);
          flag->store(true);
          wake_.notify_one();
        });
        if (pending.finish) pending.finish();
        pending = std::move(begun);
        // Without overlap (or with nothing begun) the call finishes now.
        if (!overlap_ && pending.finish) {
          pending.finish();
          pending = Pending();
        }
      } else {
        pending.finish();
        pending = Pending();
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Begin> queue_;
  bool stop_ = false;
  const bool overlap_ = [] {
    const char* env = std::getenv("ORBBEC_NVJPEG_OVERLAP");
    return !(env && std::atoi(env) == 0);
  }();
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace io
}  // namespace orbbec
