#ifdef WITH_NVJPEG
#include "io/src/cuda/nvjpeg_decoder.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <chrono>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nvjpeg.h>

#include "io/src/cuda/batch_split.h"
#include "io/src/cuda/engine_clock.h"
#include "io/src/cuda/nvjpeg_memory.h"
#include "io/src/cuda/worker_pool.h"
#include "io/src/jpeg_buffer.h"

namespace orbbec {
namespace io {
namespace {

const char* status_name(nvjpegStatus_t s) {
  switch (s) {
    case NVJPEG_STATUS_SUCCESS: return "success";
    case NVJPEG_STATUS_NOT_INITIALIZED: return "not initialized";
    case NVJPEG_STATUS_INVALID_PARAMETER: return "invalid parameter";
    case NVJPEG_STATUS_BAD_JPEG: return "bad JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED: return "JPEG not supported";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE: return "allocator failure";
    case NVJPEG_STATUS_EXECUTION_FAILED: return "execution failed";
    case NVJPEG_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case NVJPEG_STATUS_INTERNAL_ERROR: return "internal error";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED: return "implementation not supported";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM: return "incomplete bitstream";
  }
  return "unknown status";
}

// The status, and for an allocator failure the CUDA call that failed on this thread (nvjpeg_memory.h).
std::string status_detail(nvjpegStatus_t s) {
  std::string out = status_name(s);
  AllocationFailure& failure = last_allocation_failure();
  if (s == NVJPEG_STATUS_ALLOCATOR_FAILURE && failure.call) {
    out += std::string(" (") + failure.call + " of " + std::to_string(failure.bytes) +
           " bytes: " + cudaGetErrorString(failure.error) + ")";
    failure = AllocationFailure{};
  }
  return out;
}

#define ORBBEC_NVJPEG(call)                                                                     \
  do {                                                                                         \
    nvjpegStatus_t s_ = (call);                                                                \
    TORCH_CHECK(s_ == NVJPEG_STATUS_SUCCESS, "nvJPEG: " #call " failed: ", status_detail(s_)); \
  } while (0)
#define ORBBEC_CUDA(call)                                                                             \
  do {                                                                                               \
    cudaError_t e_ = (call);                                                                         \
    TORCH_CHECK(e_ == cudaSuccess, "orbbec.io: " #call " failed: ", cudaGetErrorString(e_)); \
  } while (0)

using Clock = std::chrono::steady_clock;

nvjpegOutputFormat_t output_format(JpegMode mode) {
  switch (mode) {
    case JpegMode::BGR: return NVJPEG_OUTPUT_BGRI;
    case JpegMode::GRAY: return NVJPEG_OUTPUT_Y;
    default: return NVJPEG_OUTPUT_RGBI;
  }
}

int channels(JpegMode mode) { return mode == JpegMode::GRAY ? 1 : 3; }

// One thread's nvJPEG objects: a hybrid decoder state with two pinned buffers, so that the Huffman
// decoding of the next image overlaps the copy of the previous one. Its work goes to its own stream.
struct Worker {
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;

  nvjpegJpegStream_t header = nullptr;  // for the parse phase
  nvjpegJpegDecoder_t decoder = nullptr;
  nvjpegJpegState_t state = nullptr;
  nvjpegBufferPinned_t pinned[2] = {nullptr, nullptr};
  nvjpegBufferDevice_t device_buffer = nullptr;
  nvjpegJpegStream_t bitstream[2] = {nullptr, nullptr};
  cudaEvent_t copied[2] = {nullptr, nullptr};
  bool copy_pending[2] = {false, false};
  int next_buffer = 0;
  nvjpegDecodeParams_t params = nullptr;
};

// One hardware batch in flight: its nvJPEG state sizes itself to the largest batch of the largest
// images it has seen, so the decoder keeps only a few of them (not one per thread) to bound memory.
struct HwLane {
  std::mutex busy;  // one hardware batch at a time on this state (batches of two calls overlap)
  nvjpegJpegState_t state = nullptr;
  int batch = 0;
  nvjpegOutputFormat_t format = NVJPEG_OUTPUT_UNCHANGED;
  std::vector<nvjpegDecodeParams_t> params;
  cudaEvent_t end = nullptr;
};

int default_threads() {
  if (const char* env = std::getenv("ORBBEC_DECODE_THREADS")) {
    if (std::atoi(env) > 0) return std::atoi(env);
  }
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores - 2, 2, 16);  // leave a core to the hardware lanes' submission
}

int requested_threads = 0;

class Decoder;

// Counts one batch's hardware submissions (nvjpegDecodeBatched calls) down. The next batch's
// submissions wait for it: two batches' calls at once each took about twice as long on the H100
// (1080p: 18-20 against 8 ms per call), and the engine ran slower than with one call at a time.
struct SubmitLatch {
  explicit SubmitLatch(int submissions) : left(submissions) {
    if (submissions == 0) done.set_value();
  }
  void count_down() {
    if (--left == 0) done.set_value();
  }
  std::atomic<int> left;
  std::promise<void> done;
  std::shared_future<void> ready = done.get_future().share();
};

// One batch between begin and finish: what its jobs read and write. The jobs hold a plain pointer
// to it; the last group's on_done holds a reference, so it outlives every job.
struct Batch : StartedBatch {
  Decoder* decoder = nullptr;
  const std::vector<EncodedImage>* images = nullptr;
  JpegMode mode = JpegMode::RGB;
  std::vector<DecodedImage> out;
  std::vector<ImagePlan> plans;
  PathLists paths;
  std::vector<std::vector<size_t>> chunks;  // hardware batches (one per lane)
  size_t first_lane = 0;
  int clock_slot = -1;
  cudaStream_t current = nullptr;  // the caller's stream at begin: the results are handed to it
  std::vector<char> used;                // per worker: it ran a job of this batch
  std::vector<double> hybrid_seconds;    // per worker: host time on this batch's hybrid images
  WorkerPool::GroupPtr hardware_jobs, hybrid_jobs;
  std::shared_ptr<SubmitLatch> submitted, previous_submitted;
  std::atomic<int> groups_left{2};
  std::function<void()> on_jobs_done;
  Clock::time_point t_start, t_parsed, t_allocated;
  bool finished = false;
  ~Batch() override;
};

class Decoder {
 public:
  explicit Decoder(int device) : device_(device) {
    c10::cuda::CUDAGuard guard(device);
    // The default backend's handle failed now and then with "allocator failure" (no CUDA allocation of
    // ours behind it) with eight test processes on one H100, as the engine's states did (create_lanes);
    // the hybrid backend's handle serves the hybrid decoders as well.
    if (nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT, counted_device_allocator(), counted_pinned_allocator(),
                       NVJPEG_FLAGS_DEFAULT, &handle_) != NVJPEG_STATUS_SUCCESS) {
      handle_ = nullptr;
      last_allocation_failure() = AllocationFailure{};  // the failed attempt's, not to be reported later
      ORBBEC_NVJPEG(nvjpegCreateEx(NVJPEG_BACKEND_HYBRID, counted_device_allocator(), counted_pinned_allocator(),
                                  NVJPEG_FLAGS_DEFAULT, &handle_));
    }
    // The hardware engine exists on A100, H100 and their kin; elsewhere everything takes the hybrid path.
    // ORBBEC_NVJPEG_HARDWARE=0 leaves the hardware engine alone (everything takes the hybrid path).
    const char* use_hardware = std::getenv("ORBBEC_NVJPEG_HARDWARE");
    if ((use_hardware && std::atoi(use_hardware) == 0) ||
        nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, counted_device_allocator(), counted_pinned_allocator(),
                       NVJPEG_FLAGS_DEFAULT, &hw_handle_) !=
            NVJPEG_STATUS_SUCCESS) {
      hw_handle_ = nullptr;
    }
    const int n = requested_threads > 0 ? requested_threads : default_threads();
    pool_ = std::make_unique<WorkerPool>(n, [device](int) { cudaSetDevice(device); });
    hybrid_rate_per_thread_ = 3e8;  // px/s, a first guess replaced by measurements
    hardware_rate_ = 1e10;
    // Hardware batches in flight at once (each from its own thread and stream).
    if (const char* lanes = std::getenv("ORBBEC_NVJPEG_LANES")) max_lanes_ = std::max(1, std::atoi(lanes));
    // ORBBEC_NVJPEG_SPLIT=1 moves images the hardware engine could decode to the hybrid path when the
    // measured rates say the batch finishes sooner. Off by default: which path decodes an image then
    // depends on timing, and the two paths' pixels differ slightly, so the same batch would not
    // always decode to the same bits; and on small images it was slower (docs/dev/decode.md).
    if (const char* split = std::getenv("ORBBEC_NVJPEG_SPLIT")) split_ = std::atoi(split) != 0;
    // ORBBEC_NVJPEG_SHARE=0 keeps every image the engine takes on the engine: the share of large
    // batches (share_large_images) assumes host cores as fast as the H100 machine's, and on a slower
    // or busier host it cost up to 10% (docs/dev/decode.md).
    if (const char* share = std::getenv("ORBBEC_NVJPEG_SHARE")) share_ = std::atoi(share) != 0;
    // ORBBEC_NVJPEG_OVERLAP_SHARE=0: batches begun while the previous one finishes take the same
    // share as single calls (one round of the hybrid threads), for comparison.
    if (const char* o = std::getenv("ORBBEC_NVJPEG_OVERLAP_SHARE")) overlap_share_ = std::atoi(o) != 0;
    // ORBBEC_NVJPEG_SHARE_MIN_PIXELS: the smallest image (output pixels) the share may move.
    if (const char* m = std::getenv("ORBBEC_NVJPEG_SHARE_MIN_PIXELS")) share_min_pixels_ = std::atoll(m);
    // ORBBEC_PARSE_JOB_BYTES: the bitstream bytes one parse job covers; 0 parses one image per job.
    if (const char* p = std::getenv("ORBBEC_PARSE_JOB_BYTES")) parse_job_bytes_ = std::atoll(p);
    // ORBBEC_NVJPEG_PARSE_WHOLE=1: plan() parses each whole bitstream, as before the header-only
    // parse (for comparison).
    if (const char* p = std::getenv("ORBBEC_NVJPEG_PARSE_WHOLE")) parse_whole_ = std::atoi(p) != 0;
    // ORBBEC_NVJPEG_ENGINE_TURNS=0: a batch's engine submissions need not wait for the previous
    // batch's (for comparison; see SubmitLatch).
    if (const char* t = std::getenv("ORBBEC_NVJPEG_ENGINE_TURNS")) engine_turns_ = std::atoi(t) != 0;
    if (hw_handle_) {
      // Twice the lanes one call uses, so that consecutive calls alternate (see begin());
      // ORBBEC_NVJPEG_LANE_SETS=3: three times (a lane then waits for the call three back).
      int sets = 2;
      if (const char* env = std::getenv("ORBBEC_NVJPEG_LANE_SETS")) sets = std::max(2, std::atoi(env));
      create_lanes(sets * max_lanes_);
    }
    if (hw_handle_) engine_clock_ = std::make_unique<EngineClock>(max_lanes_);
    // After the lanes: the workers' header streams belong to the hardware handle while it exists.
    workers_.resize(n + 1);  // the last one for the calling thread, which parses headers too
    for (auto& w : workers_) create(w);
    ORBBEC_CUDA(cudaStreamCreateWithFlags(&alloc_stream_, cudaStreamNonBlocking));
  }

  ~Decoder() {
    pool_.reset();
    for (auto& l : lanes_) destroy(l);
    engine_clock_.reset();
    for (auto& w : workers_) destroy(w);
    if (hw_handle_) nvjpegDestroy(hw_handle_);
    nvjpegDestroy(handle_);
    if (alloc_stream_) cudaStreamDestroy(alloc_stream_);
  }

  std::shared_ptr<Batch> begin(const std::vector<EncodedImage>& images, JpegMode mode, int only_path, bool one_block,
                               bool overlapped, std::function<void()> on_jobs_done);
  std::vector<DecodedImage> finish(Batch& b);
  void wait_for_jobs(Batch& b) {
    pool_->wait(b.hardware_jobs);
    pool_->wait(b.hybrid_jobs);
  }
  DecoderStats stats() const;

 private:
  void create(Worker& w) {
    ORBBEC_CUDA(cudaStreamCreateWithFlags(&w.stream, cudaStreamNonBlocking));
    ORBBEC_CUDA(cudaEventCreateWithFlags(&w.done, cudaEventDisableTiming));
    ORBBEC_NVJPEG(nvjpegJpegStreamCreate(hw_handle_ ? hw_handle_ : handle_, &w.header));
    ORBBEC_NVJPEG(nvjpegDecoderCreate(handle_, NVJPEG_BACKEND_HYBRID, &w.decoder));
    ORBBEC_NVJPEG(nvjpegDecoderStateCreate(handle_, w.decoder, &w.state));
    ORBBEC_NVJPEG(nvjpegBufferDeviceCreate(handle_, nullptr, &w.device_buffer));
    ORBBEC_NVJPEG(nvjpegStateAttachDeviceBuffer(w.state, w.device_buffer));
    for (int b = 0; b < 2; ++b) {
      ORBBEC_NVJPEG(nvjpegBufferPinnedCreate(handle_, nullptr, &w.pinned[b]));
      ORBBEC_NVJPEG(nvjpegJpegStreamCreate(handle_, &w.bitstream[b]));
      ORBBEC_CUDA(cudaEventCreateWithFlags(&w.copied[b], cudaEventDisableTiming));
    }
    ORBBEC_NVJPEG(nvjpegDecodeParamsCreate(handle_, &w.params));
  }

  // The hardware engine's states are a resource of the whole GPU: with many processes on one GPU
  // (eight test processes at once on an H100) their creation failed with "allocator failure" and no
  // CUDA allocation behind it. The decoder then does without the engine (hybrid path only) and says
  // so once, rather than failing every decode of the process.
  void create_lanes(int count) {
    try {
      for (int l = 0; l < count; ++l) create(lanes_.emplace_back());
    } catch (const c10::Error& e) {
      for (auto& l : lanes_) destroy(l);
      lanes_.clear();
      nvjpegDestroy(hw_handle_);
      hw_handle_ = nullptr;
      hardware_unavailable_ = e.what_without_backtrace();
      TORCH_WARN("orbbec.io: the GPU's JPEG engine is not available to this process (", hardware_unavailable_,
                 "); every image takes the hybrid path");
    }
  }

  void create(HwLane& l) {
    ORBBEC_NVJPEG(nvjpegJpegStateCreate(hw_handle_, &l.state));
    ORBBEC_CUDA(cudaEventCreateWithFlags(&l.end, cudaEventBlockingSync));
  }

  static void destroy(HwLane& l) {
    if (l.end) cudaEventSynchronize(l.end);
    for (auto p : l.params) nvjpegDecodeParamsDestroy(p);
    if (l.state) nvjpegJpegStateDestroy(l.state);
    if (l.end) cudaEventDestroy(l.end);
  }

  static void destroy(Worker& w) {
    if (w.stream) cudaStreamSynchronize(w.stream);
    if (w.params) nvjpegDecodeParamsDestroy(w.params);
    if (w.state) nvjpegJpegStateDestroy(w.state);
    if (w.decoder) nvjpegDecoderDestroy(w.decoder);
    for (int b = 0; b < 2; ++b) {
      if (w.bitstream[b]) nvjpegJpegStreamDestroy(w.bitstream[b]);
      if (w.pinned[b]) nvjpegBufferPinnedDestroy(w.pinned[b]);
      if (w.copied[b]) cudaEventDestroy(w.copied[b]);
    }
    if (w.device_buffer) nvjpegBufferDeviceDestroy(w.device_buffer);
    if (w.header) nvjpegJpegStreamDestroy(w.header);
    if (w.done) cudaEventDestroy(w.done);
    if (w.stream) cudaStreamDestroy(w.stream);
  }

  void plan(Worker& w, const EncodedImage& in, JpegMode mode, ImagePlan& plan, DecodedImage& out);
  // Both add their host time on hybrid images to `hybrid_seconds`.
  void decode_hybrid(Worker& w, const EncodedImage& in, JpegMode mode, DecodedImage& out, double& hybrid_seconds);
  void decode_hardware(Worker& w, HwLane& lane, Batch& b, int job, double& hybrid_seconds);

  int device_;
  nvjpegHandle_t handle_ = nullptr, hw_handle_ = nullptr;
  std::string hardware_unavailable_;  // why the engine's lanes could not be created, if they could not
  std::vector<Worker> workers_;
  std::deque<HwLane> lanes_;
  std::unique_ptr<WorkerPool> pool_;
  // Outputs are allocated on this stream, which runs nothing (see decode()).
  cudaStream_t alloc_stream_ = nullptr;
  // Begins and finishes take it (one at a time per device), and stats() reads under it; two
  // batches' jobs may run at once.
  mutable std::mutex mutex_;

  // Measured rates, in output pixels per second, for the split and decoder_stats: the hardware
  // engine's (EngineClock, read calls later so as never to wait for the GPU), and one hybrid
  // thread's (from host time).
  double hardware_rate_, hybrid_rate_per_thread_;
  int64_t hardware_images_ = 0, hybrid_images_ = 0;
  std::atomic<int64_t> hardware_failures_{0};
  std::atomic<int64_t> lane_initializations_{0};
  int max_lanes_ = 3;
  size_t next_lane_ = 0;  // the lane the next call's first hardware batch takes
  bool split_ = false;
  bool share_ = true;
  bool overlap_share_ = true;
  int64_t share_min_pixels_ = kShareMinPixels;
  int64_t parse_job_bytes_ = kParseJobBytes;
  bool parse_whole_ = false;
  bool engine_turns_ = true;
  std::shared_ptr<SubmitLatch> last_submitted_;  // the latest batch's, for the next batch to wait on
  std::unique_ptr<EngineClock> engine_clock_;  // with the hardware engine only
  DecoderHostTime host_time_;  // the calling thread's phases (under mutex_)
  // The lanes' waits and submissions, in nanoseconds, added from the pool's threads.
  std::atomic<int64_t> lane_wait_ns_{0}, lane_submit_ns_{0};
};

int64_t nanoseconds_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count();
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void Decoder::plan(Worker& w, const EncodedImage& in, JpegMode mode, ImagePlan& plan, DecodedImage& out) {
  out.error = jpeg_buffer_problem(in.data, in.size);
  if (!out.error.empty()) return;
  const nvjpegHandle_t parser = hw_handle_ ? hw_handle_ : handle_;
  // The segments up to the first scan are all a plan needs (size, orientation, whether the engine
  // takes it). nvjpegJpegStreamParse with save_metadata walks the whole bitstream as well: in the
  // loader on an H200 the parse phase took 1.14 against 0.36 ms per cls-500x375 batch, 0.88 against
  // 0.47 per det batch (docs/dev/decode.md). Damage past the header is then found by the decoder
  // that takes the image (a failed engine batch is decoded again image by image).
  nvjpegStatus_t s = parse_whole_ ? nvjpegJpegStreamParse(parser, in.data, in.size, 1, 0, w.header)
                                  : nvjpegJpegStreamParseHeader(parser, in.data, in.size, w.header);
  if (s != NVJPEG_STATUS_SUCCESS) {
    out.error = std::string("corrupt JPEG header (nvJPEG: ") + status_name(s) + ")";
    out.unsupported = s == NVJPEG_STATUS_JPEG_NOT_SUPPORTED;
    return;
  }
  unsigned width = 0, height = 0;
  nvjpegJpegStreamGetFrameDimensions(w.header, &width, &height);
  if (width == 0 || height == 0) {
    out.error = "corrupt JPEG header: zero width or height";
    return;
  }
  nvjpegExifOrientation_t orientation = NVJPEG_ORIENTATION_NORMAL;
  if (nvjpegJpegStreamGetExifOrientation(w.header, &orientation) == NVJPEG_STATUS_SUCCESS &&
      orientation >= NVJPEG_ORIENTATION_NORMAL && orientation <= NVJPEG_ORIENTATION_ROTATE_270) {
    out.exif_orientation = static_cast<int>(orientation);
  }
  const auto& r = in.roi;
  plan.width = width;
  plan.height = height;
  if (r[2] >= 0) {
    if (r[0] < 0 || r[1] < 0 || r[2] <= 0 || r[3] <= 0 || r[0] + r[2] > static_cast<int>(width) ||
        r[1] + r[3] > static_cast<int>(height)) {
      out.error = "roi (" + std::to_string(r[0]) + ", " + std::to_string(r[1]) + ", " + std::to_string(r[2]) +
                  ", " + std::to_string(r[3]) + ") is not inside the " + std::to_string(width) + " x " +
                  std::to_string(height) + " image";
      return;
    }
    plan.width = r[2];
    plan.height = r[3];
  }
  plan.pixels = plan.width * plan.height;
  plan.ok = true;
  if (hw_handle_) {
    int unsupported = 1;
    if (r[2] >= 0) {
      nvjpegDecodeParamsSetOutputFormat(w.params, output_format(mode));
      nvjpegDecodeParamsSetROI(w.params, r[0], r[1], r[2], r[3]);
      s = nvjpegDecodeBatchedSupportedEx(hw_handle_, w.header, w.params, &unsupported);
    } else {
      s = nvjpegDecodeBatchedSupported(hw_handle_, w.header, &unsupported);
    }
    plan.hardware = s == NVJPEG_STATUS_SUCCESS && unsupported == 0;
  }
}

void Decoder::decode_hybrid(Worker& w, const EncodedImage& in, JpegMode mode, DecodedImage& out,
                            double& hybrid_seconds) {
  const auto t0 = Clock::now();
  const int b = w.next_buffer;
  w.next_buffer ^= 1;
  // The pinned buffer `b` may still be feeding the copy of the image before last.
  if (w.copy_pending[b]) {
    cudaEventSynchronize(w.copied[b]);
    w.copy_pending[b] = false;
  }
  nvjpegStatus_t s = nvjpegJpegStreamParse(handle_, in.data, in.size, 0, 0, w.bitstream[b]);
  if (s == NVJPEG_STATUS_SUCCESS) s = nvjpegStateAttachPinnedBuffer(w.state, w.pinned[b]);
  if (s == NVJPEG_STATUS_SUCCESS) s = nvjpegDecodeParamsSetOutputFormat(w.params, output_format(mode));
  if (s == NVJPEG_STATUS_SUCCESS) s = nvjpegDecodeParamsSetROI(w.params, in.roi[0], in.roi[1], in.roi[2], in.roi[3]);
  if (s == NVJPEG_STATUS_SUCCESS) s = nvjpegDecodeParamsSetAllowCMYK(w.params, 1);
  if (s == NVJPEG_STATUS_SUCCESS) {
    int unsupported = 0;
    s = nvjpegDecoderJpegSupported(w.decoder, w.bitstream[b], w.params, &unsupported);
    if (s == NVJPEG_STATUS_SUCCESS && unsupported) s = NVJPEG_STATUS_JPEG_NOT_SUPPORTED;
  }
  if (s == NVJPEG_STATUS_SUCCESS) s = nvjpegDecodeJpegHost(handle_, w.decoder, w.state, w.params, w.bitstream[b]);
  if (s == NVJPEG_STATUS_SUCCESS) s = nvjpegDecodeJpegTransferToDevice(handle_, w.decoder, w.state, w.bitstream[b], w.stream);
  if (s == NVJPEG_STATUS_SUCCESS) {
    cudaEventRecord(w.copied[b], w.stream);
    w.copy_pending[b] = true;
    nvjpegImage_t dst{};
    dst.channel[0] = out.image.data_ptr<uint8_t>();
    dst.pitch[0] = static_cast<size_t>(out.image.size(1)) * out.image.size(2);
    s = nvjpegDecodeJpegDevice(handle_, w.decoder, w.state, &dst, w.stream);
  }
  out.path = 1;
  if (s != NVJPEG_STATUS_SUCCESS) {
    out.error = std::string(s == NVJPEG_STATUS_JPEG_NOT_SUPPORTED ? "not supported by nvJPEG"
                                                                   : "corrupt JPEG data") +
                " (nvJPEG: " + status_name(s) + ")";
    out.unsupported = s == NVJPEG_STATUS_JPEG_NOT_SUPPORTED || s == NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED;
  }
  hybrid_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

void Decoder::decode_hardware(Worker& w, HwLane& lane, Batch& b, int job, double& hybrid_seconds) {
  std::lock_guard<std::mutex> lane_lock(lane.busy);
  const std::vector<size_t>& chunk = b.chunks[job];
  const std::vector<EncodedImage>& images = *b.images;
  const JpegMode mode = b.mode;
  std::vector<DecodedImage>& out = b.out;
  const int clock_slot = b.clock_slot, batch = job;
  const int n = static_cast<int>(chunk.size());
  const nvjpegOutputFormat_t format = output_format(mode);
  std::vector<const unsigned char*> data(n);
  std::vector<size_t> sizes(n);
  std::vector<nvjpegImage_t> dst(n);
  bool any_roi = false;
  for (int k = 0; k < n; ++k) {
    const EncodedImage& in = images[chunk[k]];
    const at::Tensor& img = out[chunk[k]].image;
    data[k] = in.data;
    sizes[k] = in.size;
    dst[k] = nvjpegImage_t{};
    dst[k].channel[0] = img.data_ptr<uint8_t>();
    dst[k].pitch[0] = static_cast<size_t>(img.size(1)) * img.size(2);
    any_roi |= in.roi[2] >= 0;
  }
  // A lane never calls nvjpegDecodeBatched while its previous batch may still be in the engine: the
  // host waits for that batch first, outside nvJPEG. Without this wait, back-to-back calls (one
  // lane or two, one handle or one per lane, with or without other GPU work) stopped within seconds
  // on the H100: nvjpegDecodeBatched waited forever inside the driver (cuEventSynchronize,
  // cuMemFree) and the engine's batches never completed (tools/dev/decode_stress.py,
  // docs/dev/decode.md). Waiting here rather than right after the submission lets the engine's
  // work overlap the caller's next batch; the wait sleeps (a blocking-sync event). Before the
  // lane's first batch `end` is unrecorded, and the wait returns at once.
  const auto wait_start = Clock::now();
  cudaEventSynchronize(lane.end);
  lane_wait_ns_ += nanoseconds_since(wait_start);
  const auto submit_start = Clock::now();
  nvjpegStatus_t s = NVJPEG_STATUS_SUCCESS;
  if (lane.batch != n || lane.format != format) {
    ++lane_initializations_;
    s = nvjpegDecodeBatchedInitialize(hw_handle_, lane.state, n, 1, format);
    lane.batch = s == NVJPEG_STATUS_SUCCESS ? n : 0;
    lane.format = format;
  }
  if (s == NVJPEG_STATUS_SUCCESS) {
    engine_clock_->record_start(clock_slot, batch, w.stream);
    if (any_roi) {
      while (static_cast<int>(lane.params.size()) < n) {
        nvjpegDecodeParams_t p;
        ORBBEC_NVJPEG(nvjpegDecodeParamsCreate(hw_handle_, &p));
        lane.params.push_back(p);
      }
      for (int k = 0; k < n; ++k) {
        const auto& r = images[chunk[k]].roi;
        nvjpegDecodeParamsSetOutputFormat(lane.params[k], format);
        nvjpegDecodeParamsSetROI(lane.params[k], r[0], r[1], r[2], r[3]);
      }
      s = nvjpegDecodeBatchedEx(hw_handle_, lane.state, data.data(), sizes.data(), dst.data(), lane.params.data(),
                                w.stream);
    } else {
      s = nvjpegDecodeBatched(hw_handle_, lane.state, data.data(), sizes.data(), dst.data(), w.stream);
    }
    cudaEventRecord(lane.end, w.stream);
    engine_clock_->record_end(clock_slot, batch, w.stream);
  }
  lane_submit_ns_ += nanoseconds_since(submit_start);
  if (s == NVJPEG_STATUS_SUCCESS) {
    for (size_t i : chunk) out[i].path = 0;
    return;
  }
  // One bad bitstream fails the whole hardware batch: decode its images one by one instead, so that
  // the good ones survive and the bad one gets its own error. The state is re-initialised next time.
  ++hardware_failures_;
  engine_clock_->discard(clock_slot);
  lane.batch = 0;
  for (size_t i : chunk) decode_hybrid(w, images[i], mode, out[i], hybrid_seconds);
}

// The images of a batch as views of one allocation (each at a 512-byte boundary): one block and one
// stream use per batch instead of one per image, so that freeing a batch records one event in the
// caching allocator rather than one per image (which every later allocation, the training step's
// included, then has to query).
void allocate_one_block(const std::vector<ImagePlan>& plans, int64_t channels, const at::TensorOptions& options,
                        const c10::cuda::CUDAStream& current, std::vector<DecodedImage>& out) {
  std::vector<int64_t> offset(plans.size(), -1);
  int64_t total = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    if (!plans[i].ok) continue;
    offset[i] = total;
    total += (plans[i].pixels * channels + 511) / 512 * 512;
  }
  if (total == 0) return;
  // Rounded up to one of four sizes per power of two: batches whose images differ in size (the
  // loader's partial decode cuts each JPEG to a different height) then reuse one another's cached
  // blocks instead of leaving the caching allocator a block of every size (1080p: 1.2 GB more).
  const int64_t octave = int64_t{1} << (63 - __builtin_clzll(static_cast<uint64_t>(total)));
  const int64_t step = std::max<int64_t>(octave / 4, 512);
  total = (total + step - 1) / step * step;
  const at::Tensor block = at::empty({total}, options);
  c10::cuda::CUDACachingAllocator::recordStream(block.storage().data_ptr(), current);
  for (size_t i = 0; i < plans.size(); ++i) {
    if (offset[i] < 0) continue;
    out[i].image = block.slice(0, offset[i], offset[i] + plans[i].pixels * channels)
                       .view({plans[i].height, plans[i].width, channels});
  }
}

Batch::~Batch() {
  // Jobs still running read and write this batch (a batch begun and never finished).
  if (!finished && decoder != nullptr) decoder->wait_for_jobs(*this);
}

std::shared_ptr<Batch> Decoder::begin(const std::vector<EncodedImage>& images, JpegMode mode, int only_path,
                                      bool one_block, bool overlapped, std::function<void()> on_jobs_done) {
  auto b = std::make_shared<Batch>();
  b->images = &images;
  b->mode = mode;
  b->on_jobs_done = std::move(on_jobs_done);
  std::lock_guard<std::mutex> lock(mutex_);
  b->t_start = Clock::now();
  c10::cuda::CUDAGuard guard(device_);
  const size_t n = images.size();
  auto& out = b->out;
  auto& plans = b->plans;
  out.resize(n);
  plans.resize(n);
  if (engine_clock_) {
    const double rate = engine_clock_->poll();
    if (rate > 0) hardware_rate_ = 0.7 * hardware_rate_ + 0.3 * rate;
  }

  // Headers are parsed in runs of consecutive images, about parse_job_bytes_ of bitstream each (the
  // size was set when the parse read whole bitstreams): a batch of small images then wakes a few
  // threads rather than the whole pool, whose threads would take the cores that the engine's
  // submission and the loader's workers need, and claim jobs one image at a time under the pool's
  // lock.
  size_t bytes = 0;
  for (const auto& im : images) bytes += im.size;
  const size_t most = std::min<size_t>(n, pool_->size() + 1);
  const size_t jobs = parse_job_bytes_ <= 0
                          ? n
                          : std::min(most, std::max<size_t>(1, bytes / static_cast<size_t>(parse_job_bytes_)));
  const size_t per_job = jobs == 0 ? 0 : (n + jobs - 1) / jobs;
  pool_->run(jobs, [&](int w, size_t j) {
    for (size_t i = j * per_job; i < std::min(n, (j + 1) * per_job); ++i) {
      plan(workers_[w], images[i], mode, plans[i], out[i]);
    }
  });
  b->t_parsed = Clock::now();

  // nvJPEG's hardware engine starts writing when nvjpegDecodeBatched is called, not when its stream
  // reaches the call (seen on H100 with nvJPEG 12.3-13.2, and reported to torchcodec): memory that
  // the caching allocator hands out on the current stream may still be read by queued kernels. So
  // outputs come from the pool of a stream that runs nothing, and are marked as used on the current
  // stream: the allocator reuses a block only after the current stream has passed the point where
  // it was freed, checked on the host. The decoder's streams therefore need not wait for the
  // current stream at all.
  const auto current = c10::cuda::getCurrentCUDAStream(device_);
  b->current = current.stream();
  const auto options = at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device_);
  PathLists& paths = b->paths;
  {
    c10::cuda::CUDAStreamGuard on_alloc(c10::cuda::getStreamFromExternal(alloc_stream_, device_));
    if (one_block) {
      allocate_one_block(plans, channels(mode), options, current, out);
    } else {
      for (size_t i = 0; i < n; ++i) {
        if (!plans[i].ok) continue;
        out[i].image = at::empty({plans[i].height, plans[i].width, channels(mode)}, options);
        c10::cuda::CUDACachingAllocator::recordStream(out[i].image.storage().data_ptr(), current);
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (plans[i].ok) paths.add(plans, i);
    }
  }
  int lanes = hardware_lanes(paths, max_lanes_);
  const int hybrid_threads = std::max(1, pool_->size() - lanes);
  if (only_path == 1) {
    paths.all_to_hybrid();
  } else if (only_path == -1 && split_) {
    split_by_rates(plans, hybrid_threads, hardware_rate_, hybrid_rate_per_thread_, paths);
  } else if (only_path == -1 && share_) {
    share_large_images(plans, hybrid_threads, overlapped && overlap_share_, paths, share_min_pixels_);
  }
  const std::vector<size_t>& hardware = paths.hardware;
  lanes = hardware.empty() ? 0 : std::min<int>(lanes, hardware.size());
  b->chunks.resize(lanes);
  for (size_t k = 0; k < hardware.size(); ++k) b->chunks[k * lanes / hardware.size()].push_back(hardware[k]);
  // Largest hybrid images first, so that no thread is left with a big one at the end.
  std::stable_sort(paths.hybrid.begin(), paths.hybrid.end(),
                   [&](size_t x, size_t y) { return plans[x].pixels > plans[y].pixels; });
  b->used.assign(workers_.size(), 0);
  b->hybrid_seconds.assign(workers_.size(), 0.0);
  b->t_allocated = Clock::now();

  // Consecutive calls take the lanes in turn: a lane waits for its own previous batch before it
  // submits (decode_hardware), so a call that took the other lane than the call before submits
  // while that call's batch is still in the engine, instead of leaving the engine idle for the
  // whole of nvjpegDecodeBatched's host work. At most one batch per lane is in flight, as before.
  b->first_lane = next_lane_;
  if (!b->chunks.empty()) next_lane_ = (next_lane_ + b->chunks.size()) % lanes_.size();
  b->clock_slot =
      b->chunks.empty() ? -1 : engine_clock_->begin_call(static_cast<int>(b->chunks.size()), paths.hardware_pixels);
  b->submitted = std::make_shared<SubmitLatch>(static_cast<int>(b->chunks.size()));
  if (engine_turns_ && !b->chunks.empty()) {
    b->previous_submitted = last_submitted_;
    last_submitted_ = b->submitted;
  }
  b->decoder = this;
  Batch* raw = b.get();
  // The batch is alive until the second group's on_done has run (finish waits for the groups, but
  // on_done runs just after a group is marked done).
  auto group_done = [b] {
    if (--b->groups_left == 0 && b->on_jobs_done) b->on_jobs_done();
  };
  // The engine's batches go ahead of earlier batches' hybrid images, so the engine never waits for them.
  b->hardware_jobs = pool_->post(
      b->chunks.size(),
      [this, raw](int w, size_t job) {
        raw->used[w] = 1;
        if (raw->previous_submitted) {
          const auto wait_start = Clock::now();
          raw->previous_submitted->ready.wait();
          lane_wait_ns_ += nanoseconds_since(wait_start);
        }
        try {
          decode_hardware(workers_[w], lanes_[(raw->first_lane + job) % lanes_.size()], *raw, static_cast<int>(job),
                          raw->hybrid_seconds[w]);
        } catch (const std::exception& e) {
          for (size_t i : raw->chunks[job]) raw->out[i].error = e.what();
        }
        raw->submitted->count_down();
      },
      group_done, /*first=*/true);
  b->hybrid_jobs = pool_->post(
      paths.hybrid.size(),
      [this, raw](int w, size_t job) {
        raw->used[w] = 1;
        const size_t i = raw->paths.hybrid[job];
        try {
          decode_hybrid(workers_[w], (*raw->images)[i], raw->mode, raw->out[i], raw->hybrid_seconds[w]);
        } catch (const std::exception& e) {
          raw->out[i].error = e.what();
        }
      },
      group_done);
  return b;
}

std::vector<DecodedImage> Decoder::finish(Batch& b) {
  wait_for_jobs(b);
  const auto t_jobs = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  c10::cuda::CUDAGuard guard(device_);
  double hybrid_seconds = 0;
  for (size_t w = 0; w < workers_.size(); ++w) {
    hybrid_seconds += b.hybrid_seconds[w];
    if (!b.used[w]) continue;
    // A worker may have gone on to the next batch's jobs: the event then also covers some of
    // those, which only makes the wait longer, never too short.
    cudaEventRecord(workers_[w].done, workers_[w].stream);
    cudaStreamWaitEvent(b.current, workers_[w].done, 0);
  }
  if (b.clock_slot >= 0) engine_clock_->submitted(b.clock_slot);
  if (hybrid_seconds > 0 && b.paths.hybrid_pixels > 0) {
    hybrid_rate_per_thread_ = 0.7 * hybrid_rate_per_thread_ + 0.3 * (b.paths.hybrid_pixels / hybrid_seconds);
  }
  std::vector<DecodedImage> out = std::move(b.out);
  for (auto& o : out) {
    if (!o.error.empty()) {
      o.image = at::Tensor();
    } else if (o.path == 0) {
      ++hardware_images_;
    } else if (o.path == 1) {
      ++hybrid_images_;
    }
  }
  host_time_.calls += 1;
  host_time_.parse += seconds_between(b.t_start, b.t_parsed);
  host_time_.allocate += seconds_between(b.t_parsed, b.t_allocated);
  host_time_.jobs += seconds_between(b.t_allocated, t_jobs);
  host_time_.finish += seconds_between(t_jobs, Clock::now());
  host_time_.hybrid += hybrid_seconds;
  b.finished = true;
  const cudaError_t e = cudaGetLastError();
  TORCH_CHECK(e == cudaSuccess, "orbbec.io: CUDA error while decoding: ", cudaGetErrorString(e));
  return out;
}

DecoderStats Decoder::stats() const {
  DecoderStats s;
  s.threads = pool_->size();
  s.hardware_available = hw_handle_ != nullptr;
  s.hardware_unavailable = hardware_unavailable_;
  s.hardware_batches_failed = hardware_failures_;
  NvjpegMemoryCalls& m = nvjpeg_memory_calls();
  s.memory = {m.device_allocs.load(), m.device_frees.load(), m.pinned_allocs.load(), m.pinned_frees.load(),
              lane_initializations_.load()};
  {
    std::lock_guard<std::mutex> lock(mutex_);  // the calls update these under it
    s.hardware_images = hardware_images_;
    s.hybrid_images = hybrid_images_;
    s.hardware_pixels_per_s = hw_handle_ ? hardware_rate_ : 0;
    s.hybrid_pixels_per_s = hybrid_rate_per_thread_ * pool_->size();
    s.host_time = host_time_;
  }
  s.host_time.lane_wait = lane_wait_ns_.load() * 1e-9;
  s.host_time.lane_submit = lane_submit_ns_.load() * 1e-9;
  return s;
}

std::mutex decoders_mutex;
std::map<int, std::unique_ptr<Decoder>>& decoders() {
  // Never destroyed: at interpreter exit the CUDA context may already be gone.
  static auto* map = new std::map<int, std::unique_ptr<Decoder>>();
  return *map;
}

Decoder& decoder_for(int device) {
  std::lock_guard<std::mutex> lock(decoders_mutex);
  auto& d = decoders()[device];
  if (!d) d = std::make_unique<Decoder>(device);
  return *d;
}

}  // namespace

std::vector<DecodedImage> decode_jpeg_cuda(const std::vector<EncodedImage>& images, JpegMode mode, int device,
                                           int only_path, bool one_block) {
  Decoder& d = decoder_for(device);
  return d.finish(*d.begin(images, mode, only_path, one_block, false, {}));
}

std::shared_ptr<StartedBatch> begin_decode_cuda(const std::vector<EncodedImage>& images, JpegMode mode, int device,
                                                int only_path, bool one_block, bool overlapped,
                                                std::function<void()> on_jobs_done) {
  return decoder_for(device).begin(images, mode, only_path, one_block, overlapped, std::move(on_jobs_done));
}

std::vector<DecodedImage> finish_decode_cuda(StartedBatch& batch) {
  Batch& b = static_cast<Batch&>(batch);
  return b.decoder->finish(b);
}

DecoderStats decoder_stats(int device) { return decoder_for(device).stats(); }

void set_decode_threads(int threads) {
  std::lock_guard<std::mutex> lock(decoders_mutex);
  requested_threads = threads;
}

}  // namespace io
}  // namespace orbbec
#endif  // WITH_NVJPEG
