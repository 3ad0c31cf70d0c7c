// affine_opencv: the warp of a numpy uint8 image through OpenCV's C++ library (getAffineTransform, warpAffine).
// Built as orbbec.warpaffine._opencv only when OpenCV's headers are found (see setup.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <opencv2/imgproc.hpp>

namespace py = pybind11;

namespace {

py::array_t<uint8_t> affine_opencv(py::array_t<uint8_t, py::array::c_style> img,
                                   py::array_t<float, py::array::c_style> src_points,
                                   py::array_t<float, py::array::c_style> dst_points, int out_w, int out_h) {
  // Shapes are checked in Python; check again here since this is callable on its own.
  if (img.ndim() < 2 || img.ndim() > 3) throw py::value_error("'img' must be HxW or HxWxC");
  if (src_points.size() != 6 || dst_points.size() != 6) throw py::value_error("3 point pairs expected");
  const int rows = static_cast<int>(img.shape(0)), cols = static_cast<int>(img.shape(1));
  const int channels = img.ndim() == 3 ? static_cast<int>(img.shape(2)) : 1;
  if (channels != 1 && channels != 3) throw py::value_error("'img' must have 1 or 3 channels");
  const cv::Mat src(rows, cols, CV_8UC(channels), const_cast<uint8_t*>(img.data()));
  cv::Point2f s[3], d[3];
  for (int i = 0; i < 3; ++i) {
    s[i] = cv::Point2f(src_points.data()[2 * i], src_points.data()[2 * i + 1]);
    d[i] = cv::Point2f(dst_points.data()[2 * i], dst_points.data()[2 * i + 1]);
  }
  const cv::Mat M = cv::getAffineTransform(s, d);
  std::vector<ssize_t> shape = {out_h, out_w};
  if (img.ndim() == 3) shape.push_back(channels);
  py::array_t<uint8_t> result(shape);
  cv::Mat dst(out_h, out_w, CV_8UC(channels), result.mutable_data());
  {
    py::gil_scoped_release release;  // OpenCV works on its own buffers
    cv::warpAffine(src, dst, M, dst.size(), cv::INTER_LINEAR, cv::BORDER_CONSTANT, cv::Scalar::all(0));
  }
  return result;
}

}  // namespace

PYBIND11_MODULE(_opencv, m) {
  m.doc() = "orbbec's OpenCV C++ binding (affine_opencv)";
  m.def("affine_opencv", &affine_opencv, py::arg("img"), py::arg("src_points"), py::arg("dst_points"),
        py::arg("out_w"), py::arg("out_h"));
}
