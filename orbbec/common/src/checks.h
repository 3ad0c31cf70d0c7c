// Argument checks shared by every op. A failed check raises a Python ValueError or TypeError
// whose message names the argument. The message is assembled here with an ostringstream and
// thrown as a c10 error directly, so no check depends on TORCH_CHECK's variadic formatting.
#pragma once
#include <sstream>
#include <string>

#include <c10/util/Exception.h>
#include <torch/types.h>

namespace orbbec {

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
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
