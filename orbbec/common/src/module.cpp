// The Python module orbbec._C: build information only. The ops themselves are registered with
// PyTorch's dispatcher by static initialisers in each op's *_ext.cpp and kernel files, so
// importing this module is what makes torch.ops.orbbec.* available.
#include <torch/extension.h>

#ifdef WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace orbbec {
namespace io {
void bind(pybind11::module& m);  // orbbec/io/src/io_bind.cpp
}  // namespace io
namespace augment {
void bind(pybind11::module& m);  // orbbec/augment/src/philox.cpp
}  // namespace augment
}  // namespace orbbec

namespace {

std::string compiler_version() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "gcc " + std::to_string(__GNUC__) + "." + std::to_string(__GNUC_MINOR__) + "." +
         std::to_string(__GNUC_PATCHLEVEL__);
#elif defined(_MSC_VER)
  return "MSVC " + std::to_string(_MSC_FULL_VER);
#else
  return "unknown";
#endif
}

std::string cuda_version() {
#ifdef WITH_CUDA
  const int v = CUDART_VERSION;
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
#else
  return "not available";
#endif
}

bool with_cuda() {
#ifdef WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "orbbec native ops (registered under torch.ops.orbbec) and build information";
  m.def("get_compiler_version", &compiler_version, "Compiler that built orbbec._C");
  m.def("get_compiling_cuda_version", &cuda_version, "CUDA runtime version orbbec._C was built with");
  m.def("with_cuda", &with_cuda, "Whether orbbec._C has CUDA kernels");
  m.attr("torch_version") = ORBBEC_TORCH_VERSION;
  orbbec::io::bind(m);
  orbbec::augment::bind(m);
}
