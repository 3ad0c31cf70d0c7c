// Python bindings of orbbec.io's native half. pybind11 rather than the dispatcher: the inputs are
// Python byte buffers (bytes, numpy arrays, memoryviews) of many sizes, not tensors, and a decode
// call returns per-image errors beside the images.
#include <torch/extension.h>

#include <chrono>

#include "io/src/jpeg_buffer.h"
#ifdef WITH_NVJPEG
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

#ifdef WITH_NVJPEG
// Returns (images, errors, unsupported, exif_orientations, paths, seconds): per input, the uint8 HWC
// tensor or None, the error message ('' on success), whether nvJPEG cannot decode it at all, its EXIF
// orientation and the path that decoded it (0 hardware, 1 hybrid, -1 none); and the host time spent
// without the GIL, so that a caller can tell the decoder's time from waiting for the GIL.
py::tuple decode_cuda(const py::list& data, int mode, int device, const py::object& rois, int only_path) {
  const size_t n = data.size();
  std::vector<Bytes> keep;
  keep.reserve(n);
  std::vector<EncodedImage> images(n);
  for (size_t i = 0; i < n; ++i) {
    keep.push_back(bytes_of(data[i], i));
    images[i].data = keep.back().data;
    images[i].size = keep.back().size;
    if (!rois.is_none()) {
      py::object r = py::list(rois)[i];
      if (!r.is_none()) {
        auto t = r.cast<std::vector<int>>();
        if (t.size() != 4) throw py::value_error("roi[" + std::to_string(i) + "]: expected (x, y, width, height)");
        images[i].roi = {t[0], t[1], t[2], t[3]};
      }
    }
  }
  std::vector<DecodedImage> out;
  double seconds = 0;
  {
    py::gil_scoped_release release;
    const auto t0 = std::chrono::steady_clock::now();
    out = decode_jpeg_cuda(images, static_cast<JpegMode>(mode), device, only_path);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
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
  return d;
}
#endif

}  // namespace

void bind(py::module& m) {
  m.def("jpeg_buffer_problem", &problem, "Why a buffer cannot be a complete JPEG ('' if it may be)");
#ifdef WITH_NVJPEG
  m.attr("with_nvjpeg") = true;
  m.def("decode_jpeg_cuda", &decode_cuda, py::arg("data"), py::arg("mode"), py::arg("device"), py::arg("rois"),
        py::arg("only_path") = -1);
  m.def("jpeg_decoder_stats", &stats, py::arg("device"));
  m.def("set_jpeg_decode_threads", &set_decode_threads, py::arg("threads"));
#else
  m.attr("with_nvjpeg") = false;
#endif
}

}  // namespace io
}  // namespace orbbec
