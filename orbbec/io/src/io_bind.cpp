// Python bindings of orbbec.io's native half. pybind11 rather than the dispatcher: the inputs are
// Python byte buffers (bytes, numpy arrays, memoryviews) of many sizes, not tensors, and a decode
// call returns per-image errors beside the images.
#include <torch/extension.h>

#include <chrono>
#include <cstring>
#include <future>

#include "io/src/jpeg_buffer.h"
#ifdef WITH_NVJPEG
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>

#include "io/src/call_thread.h"
#include "io/src/cuda/nvjpeg_decoder.h"
#endif

namespace py = pybind11;

namespace orbbec {
namespace io {
namespace {

// A byte view of any object with the buffer protocol, kept alive while the GIL is released.
struct Bytes {
  py::buffer owner;
  const uint8_t* data = nullptr;
  size_t size = 0;
};

Bytes bytes_of(const py::handle& obj, size_t index) {
  Bytes b;
  if (!PyObject_CheckBuffer(obj.ptr())) {
    throw py::type_error("data[" + std::to_string(index) + "]: expected bytes, a numpy uint8 array or a 1-D uint8 tensor, got " +
                         std::string(py::str(obj.get_type().attr("__name__"))));
  }
  b.owner = py::reinterpret_borrow<py::buffer>(obj);
  py::buffer_info info = b.owner.request();
  const bool contiguous = info.ndim <= 1 && (info.ndim == 0 || info.strides[0] == info.itemsize);
  if (info.itemsize != 1 || !contiguous) {
    throw py::value_error("data[" + std::to_string(index) + "]: expected a contiguous 1-D buffer of bytes");
  }
  b.data = static_cast<const uint8_t*>(info.ptr);
  b.size = static_cast<size_t>(info.size);
  return b;
}

std::string problem(const py::handle& obj) {
  Bytes b = bytes_of(obj, 0);
  return jpeg_buffer_problem(b.data, b.size);
}

py::object frame_tuple(const JpegHeader& h) {
  if (!h.has_frame) return py::none();
  return py::make_tuple(h.claimed_height, h.claimed_width, h.offset, h.mcu_height, h.rows_cuttable);
}

py::object frame_header(const py::handle& obj) {
  Bytes b = bytes_of(obj, 0);
  return frame_tuple(read_jpeg_header(b.data, b.size));
}

// jpeg_buffer_problem and jpeg_frame_header from one reading of the header.
py::tuple inspect(const py::handle& obj) {
  Bytes b = bytes_of(obj, 0);
  const JpegHeader h = read_jpeg_header(b.data, b.size);
  return py::make_tuple(jpeg_buffer_problem(b.data, b.size, h), frame_tuple(h));
}

// The loader's workers' copy of a batch's encoded images into one shared buffer: each buffer of
// `data` (None: none) after the one before, and where `cuts` gives (frame header offset, rows) for
// it, those rows written into the copy's frame header (as orbbec.io._buffers.with_height does) so
// that a decoder stops there. Returns the n + 1 offsets. One native call with the GIL released:
// per image, the Python loop and its numpy views cost a face worker about as much as the copy.
py::list pack_buffers(const py::list& data, const torch::Tensor& out, const py::object& cuts) {
  TORCH_CHECK(out.device().is_cpu() && out.is_contiguous() && out.scalar_type() == torch::kUInt8,
              "pack_buffers: 'out' must be a contiguous CPU uint8 tensor");
  const size_t n = data.size();
  std::vector<Bytes> views(n);
  std::vector<std::pair<int64_t, int64_t>> cut(n, {-1, 0});
  const bool have_cuts = !cuts.is_none();
  py::list cut_list = have_cuts ? py::list(cuts) : py::list();
  if (have_cuts && cut_list.size() != n) throw py::value_error("pack_buffers: 'cuts' must hold one entry per buffer");
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!data[i].is_none()) views[i] = bytes_of(data[i], i);
    total += views[i].size;
    if (have_cuts && !cut_list[i].is_none()) {
      auto c = cut_list[i].cast<std::pair<int64_t, int64_t>>();
      if (views[i].data == nullptr || c.first < 0 || static_cast<size_t>(c.first) + 7 > views[i].size ||
          c.second <= 0 || c.second > 0xFFFF) {
        throw py::value_error("pack_buffers: cuts[" + std::to_string(i) + "] = (" + std::to_string(c.first) + ", " +
                              std::to_string(c.second) + ") does not fit its buffer of " +
                              std::to_string(views[i].size) + " bytes");
      }
      cut[i] = c;
    }
  }
  if (total > static_cast<size_t>(out.numel())) {
    throw py::value_error("pack_buffers: " + std::to_string(total) + " bytes do not fit 'out' (" +
                          std::to_string(out.numel()) + ")");
  }
  std::vector<size_t> offsets(n + 1, 0);
  uint8_t* dst = out.data_ptr<uint8_t>();
  {
    py::gil_scoped_release no_gil;
    size_t pos = 0;
    for (size_t i = 0; i < n; ++i) {
      offsets[i] = pos;
      if (views[i].size) std::memcpy(dst + pos, views[i].data, views[i].size);
      if (cut[i].first >= 0) {  // the frame header's height: 2 bytes, big-endian, 5 bytes after its FF
        dst[pos + cut[i].first + 5] = static_cast<uint8_t>(cut[i].second >> 8);
        dst[pos + cut[i].first + 6] = static_cast<uint8_t>(cut[i].second & 0xFF);
      }
      pos += views[i].size;
    }
    offsets[n] = pos;
  }
  py::list result(n + 1);
  for (size_t i = 0; i <= n; ++i) result[i] = py::int_(offsets[i]);
  return result;
}

#ifdef WITH_NVJPEG
// The encoded inputs of one call: views of the Python buffers, which `keep` holds alive. The views
// are shared with the call thread; the buffers are not (their references may be dropped only with
// the GIL held, i.e. in the caller's thread).
struct DecodeInputs {
  std::vector<Bytes> keep;
  std::shared_ptr<std::vector<EncodedImage>> images = std::make_shared<std::vector<EncodedImage>>();
};

std::shared_ptr<DecodeInputs> inputs_of(const py::list& data, const py::object& rois) {
  const size_t n = data.size();
  auto in = std::make_shared<DecodeInputs>();
  in->keep.reserve(n);
  auto& images = *in->images;
  images.resize(n);
  for (size_t i = 0; i < n; ++i) {
    in->keep.push_back(bytes_of(data[i], i));
    images[i].data = in->keep.back().data;
    images[i].size = in->keep.back().size;
    if (!rois.is_none()) {
      py::object r = py::list(rois)[i];
      if (!r.is_none()) {
        auto t = r.cast<std::vector<int>>();
        if (t.size() != 4) throw py::value_error("roi[" + std::to_string(i) + "]: expected (x, y, width, height)");
        images[i].roi = {t[0], t[1], t[2], t[3]};
      }
    }
  }
  return in;
}

// (images, errors, unsupported, exif_orientations, paths, seconds): per input, the uint8 HWC tensor
// or None, the error message ('' on success), whether nvJPEG cannot decode it at all, its EXIF
// orientation and the path that decoded it (0 hardware, 1 hybrid, -1 none); then the decoder's host
// time (without the GIL), so that a caller can tell it from waiting for the GIL.
py::tuple to_python(std::vector<DecodedImage>& out, double seconds) {
  py::list tensors, errors, unsupported, orientations, paths;
  for (auto& o : out) {
    if (o.image.defined()) tensors.append(py::cast(o.image)); else tensors.append(py::none());
    errors.append(o.error);
    unsupported.append(o.unsupported);
    orientations.append(o.exif_orientation);
    paths.append(o.path);
  }
  return py::make_tuple(tensors, errors, unsupported, orientations, paths, seconds);
}

struct Timed {
  std::vector<DecodedImage> out;
  double seconds = 0;
  at::Tensor warped;  // the batch warped after the decode (WarpAfter), or undefined
};

// A warp the call thread runs right after a batch's decode, on the caller's stream (the loader's
// augmentation): the decoded images then never travel through Python, whose per-image tensors,
// checks and dispatch held the GIL for about half a millisecond per batch of 128 beside the
// training loop. Its fields are orbbec::warp_affine_list's arguments; `matrices` are the forward
// matrices [B, 2, 3] (float64, CPU), inverted by the op.
struct WarpAfter {
  at::Tensor matrices;
  int64_t out_h = 0, out_w = 0, interpolation = 0, border_mode = 0;
  std::vector<double> border_value, mean, std;
  at::ScalarType out_dtype = at::kFloat;
  double scale = 1.0;
  bool reverse_channels = false, channels_last = false;
};

at::ScalarType dtype_named(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "float16") return at::kHalf;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "uint8") return at::kByte;
  throw py::value_error("warp: out_dtype must be float32, float16, bfloat16 or uint8, got " + name);
}

// (matrices, out_h, out_w, interpolation, border_mode, border_value, out_dtype name, mean, std,
// scale, reverse_channels, channels_last), as orbbec.warpaffine's list call passes them.
std::shared_ptr<WarpAfter> warp_after_of(const py::object& spec, size_t batch) {
  if (spec.is_none()) return nullptr;
  auto t = spec.cast<py::tuple>();
  if (t.size() != 12) throw py::value_error("warp: expected 12 arguments");
  auto w = std::make_shared<WarpAfter>();
  // A copy the call thread owns: the caller's tensor may be numpy's memory, whose release needs the
  // GIL, which the call thread must never take (a caller waits for it holding the GIL).
  w->matrices = t[0].cast<at::Tensor>().clone();
  if (w->matrices.dim() != 3 || w->matrices.size(0) != int64_t(batch) || w->matrices.scalar_type() != at::kDouble ||
      !w->matrices.device().is_cpu()) {
    throw py::value_error("warp: the matrices must be float64 [B, 2, 3] on the CPU, one per image");
  }
  w->out_h = t[1].cast<int64_t>();
  w->out_w = t[2].cast<int64_t>();
  w->interpolation = t[3].cast<int64_t>();
  w->border_mode = t[4].cast<int64_t>();
  w->border_value = t[5].cast<std::vector<double>>();
  w->out_dtype = dtype_named(t[6].cast<std::string>());
  w->mean = t[7].cast<std::vector<double>>();
  w->std = t[8].cast<std::vector<double>>();
  w->scale = t[9].cast<double>();
  w->reverse_channels = t[10].cast<bool>();
  w->channels_last = t[11].cast<bool>();
  return w;
}

// The warp of a decoded batch, on the current stream; undefined (the caller warps what it can
// itself) unless every image decoded on the GPU.
at::Tensor warp_decoded(const std::vector<DecodedImage>& out, const WarpAfter& w, int device) {
  std::vector<at::Tensor> images;
  images.reserve(out.size());
  for (const auto& o : out) {
    if (!o.image.defined() || !o.error.empty() || o.unsupported) return at::Tensor();
    images.push_back(o.image);
  }
  if (images.empty()) return at::Tensor();
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("orbbec::warp_affine_list", "")
                       .typed<at::Tensor(at::TensorList, const at::Tensor&, int64_t, int64_t, int64_t, int64_t,
                                         c10::ArrayRef<double>, at::ScalarType, c10::ArrayRef<double>,
                                         c10::ArrayRef<double>, double, bool, bool, bool)>();
  at::AutoDispatchBelowADInplaceOrView no_autograd;  // uint8 images: nothing to differentiate
  const at::Tensor M = w.matrices.to(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device)), /*non_blocking=*/true);
  return op.call(images, M, w.out_h, w.out_w, w.interpolation, w.border_mode, w.border_value, w.out_dtype, w.mean,
                 w.std, w.scale, w.reverse_channels, w.channels_last, /*invert_matrix=*/true);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Timed decode_timed(const std::vector<EncodedImage>& images, int mode, int device, int only_path, bool one_block) {
  Timed r;
  const auto t0 = std::chrono::steady_clock::now();
  r.out = decode_jpeg_cuda(images, static_cast<JpegMode>(mode), device, only_path, one_block);
  r.seconds = seconds_since(t0);
  return r;
}

py::tuple decode_cuda(const py::list& data, int mode, int device, const py::object& rois, int only_path) {
  auto in = inputs_of(data, rois);
  Timed r;
  {
    py::gil_scoped_release release;
    r = decode_timed(*in->images, mode, device, only_path, false);
  }
  return to_python(r.out, r.seconds);
}

// A decode started by decode_cuda_start: the call thread of its device begins it on the stream that
// was current when it started, and finishes it once the next batch has begun (or its images are
// done). wait() gives decode_cuda's tuple plus the seconds it took to get the GIL back once the
// result was ready.
class PendingDecode {
 public:
  PendingDecode(std::shared_ptr<DecodeInputs> in, std::future<Timed> result)
      : in_(std::move(in)), result_(std::move(result)) {}

  // The decoder reads the buffers until it is done with them: never let them go before. (The call
  // thread never takes the GIL, so waiting for it with the GIL held cannot deadlock.) A decode
  // dropped untaken drops its images here: without the GIL where this thread holds it, as wait()
  // does (freeing their block records CUDA events, and a thread holding the GIL must not wait for
  // the driver); with it at interpreter exit, where a thread that let the GIL go is ended when it
  // takes it back (the exit abort of docs/dev/decode.md).
  ~PendingDecode() {
    if (!result_.valid()) return;
    if (PyGILState_Check() && !interpreter_exiting()) {
      py::gil_scoped_release release;
      drop_result();
    } else {
      drop_result();
    }
  }

  static bool interpreter_exiting() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
  }

  void drop_result() noexcept {
    try {
      Timed r = result_.get();  // destroyed here, with the images
    } catch (...) {  // the decoder's exception: nobody asked for this batch
    }
  }

  py::tuple wait() {
    if (!result_.valid()) throw std::runtime_error("decode_jpeg_cuda_start: wait() was called already");
    Timed r;
    std::exception_ptr failed;
    std::chrono::steady_clock::time_point ready;
    {
      // Without the GIL: dropping the images frees their block, and a free records CUDA events. A
      // thread that holds the GIL must not wait for the driver: under compute-sanitizer another
      // thread's kernel launch takes the GIL from inside the driver (for its Python backtrace), and
      // the two waited for each other (the loader's decoding and augmenting threads).
      py::gil_scoped_release release;
      try {
        r = result_.get();
        if (r.warped.defined()) {
          // The images went into the warp only: None in their place (every one decoded).
          for (auto& o : r.out) o.image = at::Tensor();
        }
      } catch (...) {
        failed = std::current_exception();  // the decoder's exception, raised with the GIL held
      }
      ready = std::chrono::steady_clock::now();
    }
    const double gil = std::chrono::duration<double>(std::chrono::steady_clock::now() - ready).count();
    if (failed) std::rethrow_exception(failed);
    py::tuple t = to_python(r.out, r.seconds);
    py::object warped = r.warped.defined() ? py::cast(r.warped) : py::none();
    return py::make_tuple(t[0], t[1], t[2], t[3], t[4], t[5], gil, warped);
  }

 private:
  std::shared_ptr<DecodeInputs> in_;
  std::future<Timed> result_;
};

CallThread& call_thread(int device) {
  static std::mutex mutex;
  // Never destroyed, as the decoders are not: at interpreter exit the CUDA context may be gone.
  static auto* threads = new std::map<int, std::unique_ptr<CallThread>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& t = (*threads)[device];
  if (!t) t = std::make_unique<CallThread>();
  return *t;
}

std::shared_ptr<PendingDecode> start_inputs(std::shared_ptr<DecodeInputs> in, int mode, int device, int only_path,
                                            bool one_block, const py::object& warp_spec);

std::shared_ptr<PendingDecode> decode_cuda_start(const py::list& data, int mode, int device, const py::object& rois,
                                                 int only_path, bool one_block, const py::object& warp_spec) {
  return start_inputs(inputs_of(data, rois), mode, device, only_path, one_block, warp_spec);
}

// decode_cuda_start for a batch packed in one buffer (the loader's workers pack it so): image i is
// bytes [offsets[i], offsets[i + 1]). One buffer request instead of one Python slice and one request
// per image, which held the GIL in the loader's decoding thread.
std::shared_ptr<PendingDecode> decode_cuda_start_packed(const py::object& packed, const std::vector<int64_t>& offsets,
                                                        int mode, int device, const py::object& warp_spec) {
  if (offsets.size() < 2) throw py::value_error("offsets: expected at least two (one image)");
  auto in = std::make_shared<DecodeInputs>();
  in->keep.push_back(bytes_of(packed, 0));
  const Bytes& b = in->keep.back();
  auto& images = *in->images;
  images.resize(offsets.size() - 1);
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    if (offsets[i] < 0 || offsets[i + 1] < offsets[i] || static_cast<size_t>(offsets[i + 1]) > b.size) {
      throw py::value_error("offsets[" + std::to_string(i) + "]: image outside the packed buffer of " +
                            std::to_string(b.size) + " bytes");
    }
    images[i].data = b.data + offsets[i];
    images[i].size = static_cast<size_t>(offsets[i + 1] - offsets[i]);
  }
  return start_inputs(std::move(in), mode, device, -1, true, warp_spec);
}

std::shared_ptr<PendingDecode> start_inputs(std::shared_ptr<DecodeInputs> in, int mode, int device, int only_path,
                                            bool one_block, const py::object& warp_spec) {
  std::shared_ptr<const WarpAfter> warp = warp_after_of(warp_spec, in->images->size());
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device);
  std::shared_ptr<const std::vector<EncodedImage>> images = in->images;
  auto promise = std::make_shared<std::promise<Timed>>();
  std::future<Timed> result = promise->get_future();
  CallThread& thread = call_thread(device);
  const bool overlapped = thread.overlaps();
  thread.submit([=](std::function<void()> ready) -> CallThread::Finish {
    const auto t0 = std::chrono::steady_clock::now();
    std::shared_ptr<StartedBatch> batch;
    try {
      c10::cuda::CUDAStreamGuard on_caller_stream(stream);
      batch = begin_decode_cuda(*images, static_cast<JpegMode>(mode), device, only_path, one_block,
                                overlapped, std::move(ready));
    } catch (...) {
      promise->set_exception(std::current_exception());
      return {};
    }
    return [images, batch, promise, t0, warp, stream, device] {
      try {
        Timed r;
        r.out = finish_decode_cuda(*batch);
        if (warp) {
          c10::cuda::CUDAStreamGuard on_caller_stream(stream);
          r.warped = warp_decoded(r.out, *warp, device);
        }
        r.seconds = seconds_since(t0);
        promise->set_value(std::move(r));
      } catch (...) {
        promise->set_exception(std::current_exception());
      }
    };
  });
  return std::make_shared<PendingDecode>(std::move(in), std::move(result));
}

py::dict stats(int device) {
  const DecoderStats s = decoder_stats(device);
  py::dict d;
  d["hardware_images"] = s.hardware_images;
  d["hybrid_images"] = s.hybrid_images;
  d["hardware_batches_failed"] = s.hardware_batches_failed;
  d["hardware_pixels_per_s"] = s.hardware_pixels_per_s;
  d["hybrid_pixels_per_s"] = s.hybrid_pixels_per_s;
  d["threads"] = s.threads;
  d["hardware_available"] = s.hardware_available;
  d["hardware_unavailable"] = s.hardware_unavailable;
  const DecoderHostTime& h = s.host_time;
  py::dict host;
  host["calls"] = h.calls;
  host["parse"] = h.parse;
  host["allocate"] = h.allocate;
  host["jobs"] = h.jobs;
  host["finish"] = h.finish;
  host["lane_wait"] = h.lane_wait;
  host["lane_submit"] = h.lane_submit;
  host["hybrid"] = h.hybrid;
  d["host_seconds"] = host;
  const DecoderMemoryCalls& m = s.memory;
  py::dict memory;
  memory["device_allocs"] = m.device_allocs;
  memory["device_frees"] = m.device_frees;
  memory["pinned_allocs"] = m.pinned_allocs;
  memory["pinned_frees"] = m.pinned_frees;
  memory["lane_initializations"] = m.lane_initializations;
  d["memory_calls"] = memory;
  return d;
}

// A CPU tensor's memory page-locked in place (cudaHostRegister), so that the hardware decoder's copy
// of bitstreams read from it is a DMA queued on its stream instead of a staging copy made by the
// calling thread (host work per image that bounds the engine on small images). False when
// the driver refuses (e.g. a locked-memory limit): the buffer stays pageable and still works.
// Not torch.cuda.cudart().cudaHostRegister: that binding returns the error without clearing it, and a
// refused registration would then fail the next kernel launch check of any thread's op.
bool pin_host_memory(const torch::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), "pin_host_memory: a contiguous CPU tensor");
  if (t.numel() == 0) return false;
  if (cudaHostRegister(t.data_ptr(), t.nbytes(), cudaHostRegisterPortable) != cudaSuccess) {
    cudaGetLastError();  // not sticky; cleared so that a later launch check does not report it
    return false;
  }
  return true;
}

// The inverse; the caller makes sure no copy from the memory is still queued.
void unpin_host_memory(const torch::Tensor& t) {
  if (cudaHostUnregister(t.data_ptr()) != cudaSuccess) cudaGetLastError();
}
#endif

}  // namespace

void bind(py::module& m) {
  m.def("jpeg_buffer_problem", &problem, "Why a buffer cannot be a complete JPEG ('' if it may be)");
  m.def("jpeg_frame_header", &frame_header,
        "(height, width, offset, mcu_height, rows_cuttable) of a JPEG's frame header, or None");
  m.def("jpeg_inspect", &inspect, "(jpeg_buffer_problem, jpeg_frame_header) of a buffer");
  m.def("pack_buffers", &pack_buffers, py::arg("data"), py::arg("out"), py::arg("cuts") = py::none(),
        "Buffers copied one after another into out, frame heights cut where told; their n + 1 offsets");
#ifdef WITH_NVJPEG
  m.attr("with_nvjpeg") = true;
  m.def("decode_jpeg_cuda", &decode_cuda, py::arg("data"), py::arg("mode"), py::arg("device"), py::arg("rois"),
        py::arg("only_path") = -1);
  py::class_<PendingDecode, std::shared_ptr<PendingDecode>>(m, "PendingJpegDecode")
      .def("wait", &PendingDecode::wait);
  m.def("decode_jpeg_cuda_start", &decode_cuda_start, py::arg("data"), py::arg("mode"), py::arg("device"),
        py::arg("rois"), py::arg("only_path") = -1, py::arg("one_block") = true, py::arg("warp") = py::none(),
        "decode_jpeg_cuda in the device's call thread, in the order started, then the optional warp "
        "(warp_affine_list's arguments) of the batch; .wait() for the result");
  m.def("decode_jpeg_cuda_start_packed", &decode_cuda_start_packed, py::arg("packed"), py::arg("offsets"),
        py::arg("mode"), py::arg("device"), py::arg("warp") = py::none(),
        "decode_jpeg_cuda_start of images packed in one buffer at offsets (n + 1 of them)");
  m.def("jpeg_decoder_stats", &stats, py::arg("device"));
  m.def("set_jpeg_decode_threads", &set_decode_threads, py::arg("threads"));
  m.def("pin_host_memory", &pin_host_memory, py::arg("tensor"));
  m.def("unpin_host_memory", &unpin_host_memory, py::arg("tensor"));
#else
  m.attr("with_nvjpeg") = false;
#endif
}

}  // namespace io
}  // namespace orbbec
