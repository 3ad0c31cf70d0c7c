// Argument checks shared by every op. A failed check raises a Python ValueError or TypeError
// whose message names the argument. The message is assembled here by string appends and thrown as
// a c10 error directly. No iostreams: where the extension is linked with a static libstdc++ (the
// GPU machine's toolchain does this), its private iostream copy is never initialised and
// `ostringstream << long` crashed the process instead of raising.
#pragma once
#include <cstdio>
#include <string>
#include <type_traits>

#include <c10/util/Exception.h>
#include <torch/types.h>

namespace orbbec {
namespace detail {

inline void append(std::string& s, const char* v) { s += v; }
inline void append(std::string& s, const std::string& v) { s += v; }
inline void append(std::string& s, bool v) { s += v ? "True" : "False"; }
inline void append(std::string& s, at::ScalarType v) { s += c10::toString(v); }
inline void append(std::string& s, const c10::Device& v) { s += v.str(); }
inline void append(std::string& s, at::IntArrayRef v) {
  s += "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  s += "]";
}
template <typename T, typename std::enable_if<std::is_integral<T>::value, int>::type = 0>
void append(std::string& s, T v) {
  s += std::to_string(v);
}
template <typename T, typename std::enable_if<std::is_floating_point<T>::value, int>::type = 0>
void append(std::string& s, T v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
  s += buf;
}

}  // namespace detail

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::string out;
  (detail::append(out, parts), ...);
  return out;
}

#define ORBBEC_CHECK_VALUE(cond, ...)                                          \
  do {                                                                         \
    if (!(cond)) {                                                             \
      C10_THROW_ERROR(ValueError, ::orbbec::concat(__VA_ARGS__));              \
    }                                                                          \
  } while (0)

#define ORBBEC_CHECK_TYPE(cond, ...)                                           \
  do {                                                                         \
    if (!(cond)) {                                                             \
      C10_THROW_ERROR(TypeError, ::orbbec::concat(__VA_ARGS__));               \
    }                                                                          \
  } while (0)

inline void check_dim(const at::Tensor& t, const char* name, int64_t dim) {
  ORBBEC_CHECK_VALUE(t.dim() == dim, "orbbec: '", name, "' must be a ", dim,
                     "-D tensor, got shape ", t.sizes());
}

inline void check_same_device(const at::Tensor& t, const char* name,
                              const at::Tensor& ref, const char* ref_name) {
  ORBBEC_CHECK_VALUE(t.device() == ref.device(), "orbbec: '", name,
                     "' must be on the same device as '", ref_name, "' (",
                     ref.device(), "), got ", t.device());
}

inline void check_floating(const at::Tensor& t, const char* name) {
  ORBBEC_CHECK_TYPE(at::isFloatingType(t.scalar_type()), "orbbec: '", name,
                    "' must be a floating-point tensor, got ", t.scalar_type());
}

}  // namespace orbbec
