// One background thread that runs queued calls in the order they were queued. The GPU decoder's
// asynchronous entry (decode_jpeg_cuda_start) queues each batch here, so that the decoder works on
// one batch while the caller's Python prepares the next or finishes the last, and batches still
// reach the decoder (and the caller's stream) in the order they were started.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

namespace orbbec {
namespace io {

class CallThread {
 public:
  CallThread() : thread_([this] { loop(); }) {}

  ~CallThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    ready_.notify_one();
    thread_.join();
  }

  // Runs f() after every call queued before it; its result or exception comes through the future.
  template <typename F>
  auto submit(F f) -> std::future<decltype(f())> {
    auto task = std::make_shared<std::packaged_task<decltype(f())()>>(std::move(f));
    auto result = task->get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.emplace_back([task] { (*task)(); });
    }
    ready_.notify_one();
    return result;
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> call;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left to run
        call = std::move(queue_.front());
        queue_.pop_front();
      }
      call();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace io
}  // namespace orbbec
