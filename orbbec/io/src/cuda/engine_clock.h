// How fast the hardware JPEG engine decodes, from CUDA events, without ever waiting for the GPU.
//
// Each decode call that uses the engine takes a slot: one start event recorded before each of its
// hardware batches (one per lane it uses) and one end event after. Consecutive calls overlap in
// the engine (they take the lanes in turn), so a batch's start-to-end includes waiting for the
// previous call's batches; the engine's own time for call c runs from the later of c's start and
// the end of c - 1's batches to the end of c's. Slots are read once their call has finished and
// their ends have completed, at the start of a later call, so reading never blocks.
#pragma once
#ifdef WITH_NVJPEG
#include <algorithm>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

namespace orbbec {
namespace io {

class EngineClock {
 public:
  explicit EngineClock(int batches_per_call) {
    for (auto& s : slots_) {
      s.start.resize(batches_per_call);
      s.end.resize(batches_per_call);
      for (auto& e : s.start) cudaEventCreate(&e);
      for (auto& e : s.end) cudaEventCreate(&e);
    }
  }
  ~EngineClock() {
    for (auto& s : slots_) {
      for (auto e : s.start) cudaEventDestroy(e);
      for (auto e : s.end) cudaEventDestroy(e);
    }
  }
  EngineClock(const EngineClock&) = delete;
  EngineClock& operator=(const EngineClock&) = delete;

  // The slot of a call with `batches` hardware batches and `pixels` output pixels in them (called
  // under the decoder's lock, before the batches are submitted).
  int begin_call(int batches, int64_t pixels) {
    // Keep the slot before the oldest unread one intact: reading a slot needs its predecessor's
    // ends (an unfinished predecessor makes the sample fail, not wait).
    if (next_ - read_ > kSlots - 2) read_ = next_ - (kSlots - 2);
    Slot& s = slots_[next_ % kSlots];
    s.batches = std::min<int>(batches, static_cast<int>(s.start.size()));
    s.pixels = pixels;
    s.ok = s.batches == batches;
    s.submitted = false;
    return static_cast<int>(next_++ % kSlots);
  }
  void record_start(int slot, int batch, cudaStream_t stream) { cudaEventRecord(slots_[slot].start[batch], stream); }
  void record_end(int slot, int batch, cudaStream_t stream) { cudaEventRecord(slots_[slot].end[batch], stream); }
  // Every batch of the slot's call has been submitted (its events recorded): poll may read it.
  void submitted(int slot) { slots_[slot].submitted = true; }
  // A batch that failed (and was decoded another way) makes its call's timing meaningless.
  void discard(int slot) { slots_[slot].ok = false; }

  // Reads the finished slots in order; returns the last pixels-per-second sample, or 0 if none.
  double poll() {
    double rate = 0;
    while (read_ < next_) {
      Slot& s = slots_[read_ % kSlots];
      if (!s.submitted) return rate;  // its events may still hold an earlier call's records
      for (int b = 0; b < s.batches; ++b) {
        if (cudaEventQuery(s.end[b]) != cudaSuccess) {
          (void)cudaGetLastError();  // not ready: clear, and look again next call
          return rate;
        }
      }
      // The previous call's slot is still its own: begin_call never reuses the slot before read_.
      const Slot* prev = read_ > 0 ? &slots_[(read_ - 1) % kSlots] : nullptr;
      const double busy_ms = s.ok ? busy(s, prev) : 0;
      if (busy_ms > 0) rate = s.pixels / (busy_ms * 1e-3);
      ++read_;
    }
    return rate;
  }

 private:
  static constexpr int64_t kSlots = 8;
  struct Slot {
    std::vector<cudaEvent_t> start, end;
    int batches = 0;
    int64_t pixels = 0;
    bool ok = false;
    bool submitted = false;
  };

  // Milliseconds the engine spent on slot s: from the later of its first start and the end of the
  // previous call's batches, to its last end.
  static double busy(const Slot& s, const Slot* prev) {
    float ms = 0, last = 0;
    for (int b = 0; b < s.batches; ++b) {
      if (cudaEventElapsedTime(&ms, s.start[0], s.end[b]) != cudaSuccess) return (void)cudaGetLastError(), 0;
      last = std::max(last, ms);
    }
    float begin = 0;
    for (int b = 0; prev != nullptr && prev->ok && b < prev->batches; ++b) {
      if (cudaEventElapsedTime(&ms, s.start[0], prev->end[b]) != cudaSuccess) return (void)cudaGetLastError(), 0;
      begin = std::max(begin, ms);
    }
    return last - begin;
  }

  Slot slots_[kSlots];
  int64_t next_ = 0;            // calls given a slot
  int64_t read_ = 0;            // calls read
};

}  // namespace io
}  // namespace orbbec
#endif  // WITH_NVJPEG
