// Batched JPEG decoding on one GPU with nvJPEG, driving two engines at once:
//  - the hardware JPEG decoder (NVJPEG_BACKEND_HARDWARE, batched), for baseline JPEGs it supports;
//  - the hybrid backend (Huffman decoding on CPU threads, IDCT and colour conversion on the GPU),
//    for everything else, and for a share of a batch of large images fixed by the batch itself
//    (with ORBBEC_NVJPEG_SPLIT=1 instead: the share the hardware would finish last, by the two
//    paths' rates measured on earlier batches).
// Output tensors come from PyTorch's caching allocator, from memory that no queued
// kernel still uses, and the current stream waits for the decoder's streams before the call
// returns, so the results are ordered on the current stream like any other op's.
#pragma once
#ifdef WITH_NVJPEG
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

namespace orbbec {
namespace io {

enum class JpegMode : int { RGB = 0, BGR = 1, GRAY = 2 };

struct EncodedImage {
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::array<int, 4> roi{0, 0, -1, -1};  // x, y, width, height; width < 0: the whole image
};

struct DecodedImage {
  at::Tensor image;   // uint8 [H, W, C] on the GPU; undefined when error is set
  std::string error;  // empty on success
  bool unsupported = false;  // nvJPEG cannot decode this file at all (a CPU decoder may)
  int exif_orientation = 1;  // EXIF orientation tag, 1 when absent
  int path = -1;             // 0 hardware engine, 1 hybrid (CPU Huffman + GPU)
};

// Decodes on `device` (an index); blocks until every image's host-side work has been submitted (and
// the hardware engine has finished the earlier batches on the nvJPEG states this call reuses: those
// of the call before last when calls alternate, see decode_hardware).
// `only_path` 0 or 1 sends every image to that path (tests); -1: the hardware engine takes what it
// can, less a share of large images decided by the batch alone (with ORBBEC_NVJPEG_SPLIT=1 instead:
// the batch is divided by the measured rates). `one_block`: the images are views of one allocation,
// freed when the last of them is (the loader's batches), instead of one allocation each.
std::vector<DecodedImage> decode_jpeg_cuda(const std::vector<EncodedImage>& images, JpegMode mode, int device,
                                           int only_path = -1, bool one_block = false);

// decode_jpeg_cuda in two steps, so that one caller can begin batch N+1 before it finishes batch N
// and the decoder's threads decode the two batches' images side by side: begin parses, allocates
// on the current stream's behalf and queues the jobs; finish waits for them and hands the results
// to that stream. `images` must outlive finish. `overlapped`: the caller keeps a next batch begun
// while this one finishes, so the hybrid path takes a larger share of large images (decided by the
// batch alone, as decode_jpeg_cuda's). `on_jobs_done` runs (on a decoder thread) once finish would
// not wait.
struct StartedBatch {
  virtual ~StartedBatch() = default;
};
std::shared_ptr<StartedBatch> begin_decode_cuda(const std::vector<EncodedImage>& images, JpegMode mode, int device,
                                                int only_path, bool one_block, bool overlapped,
                                                std::function<void()> on_jobs_done);
std::vector<DecodedImage> finish_decode_cuda(StartedBatch& batch);

// Counters and the measured rates of the decoder on `device`, for benchmarks and debugging.
// Where the calling thread's time went, summed over calls (seconds): parsing the headers,
// allocating the outputs, running the jobs (hardware batches and hybrid images), and recording
// the hand-over; inside the jobs, the hardware lanes' waits for their previous batch, their
// nvjpegDecodeBatched calls, and the hybrid images' host time (the jobs' three sum over threads).
struct DecoderHostTime {
  int64_t calls = 0;
  double parse = 0, allocate = 0, jobs = 0, finish = 0;
  double lane_wait = 0, lane_submit = 0, hybrid = 0;
};

// nvJPEG's allocations and frees (device and pinned, all decoders of the process), and the hardware
// lanes' re-initialisations (nvjpegDecodeBatchedInitialize, when a lane's batch size changes).
struct DecoderMemoryCalls {
  int64_t device_allocs = 0, device_frees = 0, pinned_allocs = 0, pinned_frees = 0;
  int64_t lane_initializations = 0;
};

struct DecoderStats {
  int64_t hardware_images = 0, hybrid_images = 0, hardware_batches_failed = 0;
  double hardware_pixels_per_s = 0, hybrid_pixels_per_s = 0;
  int threads = 0;
  bool hardware_available = false;
  std::string hardware_unavailable;  // why the engine could not be used, when it exists but failed
  DecoderHostTime host_time;
  DecoderMemoryCalls memory;
};
DecoderStats decoder_stats(int device);

// Threads of the hybrid path for decoders created from now on (0: the default).
void set_decode_threads(int threads);

}  // namespace io
}  // namespace orbbec
#endif  // WITH_NVJPEG
