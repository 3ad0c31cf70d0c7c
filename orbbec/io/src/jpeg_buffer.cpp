#include "jpeg_buffer.h"

#include <cstring>

namespace orbbec {
namespace io {

namespace {

// Signatures of the formats a dataset is most likely to mix in, named in the error.
const char* other_format(const uint8_t* d, size_t n) {
  if (n >= 8 && std::memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0) return "PNG";
  if (n >= 6 && (std::memcmp(d, "GIF87a", 6) == 0 || std::memcmp(d, "GIF89a", 6) == 0)) return "GIF";
  if (n >= 2 && d[0] == 'B' && d[1] == 'M') return "BMP";
  if (n >= 12 && std::memcmp(d, "RIFF", 4) == 0 && std::memcmp(d + 8, "WEBP", 4) == 0) return "WebP";
  if (n >= 4 && (std::memcmp(d, "II*\0", 4) == 0 || std::memcmp(d, "MM\0*", 4) == 0)) return "TIFF";
  return nullptr;
}

}  // namespace

std::string jpeg_buffer_problem(const uint8_t* data, size_t size) {
  if (size == 0 || data == nullptr) return "empty buffer";
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8 || data[2] != 0xFF) {
    const char* fmt = other_format(data, size);
    return fmt ? std::string("not a JPEG (") + fmt + " signature)" : "not a JPEG (no start-of-image marker)";
  }
  // The end-of-image marker FF D9 cannot occur inside entropy-coded data (a coded FF byte is always
  // followed by 00 or a restart marker), so its absence means the file was cut short. Encoders may
  // leave padding after it: look back from the end.
  for (size_t i = size - 1; i >= 3; --i) {
    if (data[i] == 0xD9 && data[i - 1] == 0xFF) return "";
  }
  return "truncated: no end-of-image marker";
}

}  // namespace io
}  // namespace orbbec
