#include "jpeg_buffer.h"

#include <algorithm>
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

bool is_start_of_frame(uint8_t m) { return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC; }

}  // namespace

std::string jpeg_buffer_problem(const uint8_t* data, size_t size) {
  return jpeg_buffer_problem(data, size, read_jpeg_header(data, size));
}

std::string jpeg_buffer_problem(const uint8_t* data, size_t size, const JpegHeader& f) {
  if (size == 0 || data == nullptr) return "empty buffer";
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8 || data[2] != 0xFF) {
    const char* fmt = other_format(data, size);
    return fmt ? std::string("not a JPEG (") + fmt + " signature)" : "not a JPEG (no start-of-image marker)";
  }
  // The end-of-image marker FF D9 cannot occur inside entropy-coded data (a coded FF byte is always
  // followed by 00 or a restart marker), so its absence means the file was cut short. Encoders may
  // leave padding after it: look back from the end.
  bool ends = false;
  for (size_t i = size - 1; i >= 3 && !ends; --i) ends = data[i] == 0xD9 && data[i - 1] == 0xFF;
  if (!ends) return "truncated: no end-of-image marker";
  // Every 8 x 8 block of a Huffman-coded image takes at least one bit (its DC code), so a header
  // that claims more blocks than the file has bits is damaged or forged; decoding it would allocate
  // the claimed size (up to 65535 x 65535 x 3 bytes) and lose the batch to an out-of-memory error.
  if (f.huffman && f.claimed_width * f.claimed_height > uint64_t(size) * 8 * 64) {
    return "frame header claims " + std::to_string(f.claimed_width) + " x " + std::to_string(f.claimed_height) +
           " pixels, more than a file of " + std::to_string(size) + " bytes can hold";
  }
  return "";
}

JpegHeader read_jpeg_header(const uint8_t* d, size_t n) {
  JpegHeader h;
  if (d == nullptr || n < 4 || d[0] != 0xFF || d[1] != 0xD8) return h;
  bool seen_frame = false, sequential = false;
  uint32_t components = 0;
  size_t pos = 2;
  while (pos + 4 <= n && d[pos] == 0xFF) {
    const uint8_t m = d[pos + 1];
    if (m == 0xFF) {  // fill byte
      ++pos;
      continue;
    }
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {  // markers without a length
      pos += 2;
      continue;
    }
    const size_t length = (size_t(d[pos + 2]) << 8) | d[pos + 3];
    if (m == 0xD9 || length < 2) break;
    if (m == 0xDA) {  // the first scan: its component count (after the length) says if it is the only one
      if (h.has_frame) h.rows_cuttable = sequential && pos + 4 < n && d[pos + 4] == components;
      break;
    }
    if (is_start_of_frame(m) && !seen_frame) {
      seen_frame = true;
      if (pos + 9 > n) break;
      h.claimed_height = (uint64_t(d[pos + 5]) << 8) | d[pos + 6];
      h.claimed_width = (uint64_t(d[pos + 7]) << 8) | d[pos + 8];
      h.huffman = m <= 0xC7;
      if (pos + 10 > n) break;
      components = d[pos + 9];
      if (h.claimed_height == 0 || h.claimed_width == 0 || pos + 10 + 3 * size_t(components) > n) break;
      // Each component's sampling factors follow its id: the largest vertical one sets the MCU's rows
      // (a single component is coded in 8 x 8 blocks whatever its factors say).
      uint32_t vmax = 1;
      for (uint32_t k = 0; k < components; ++k) vmax = std::max<uint32_t>(vmax, d[pos + 11 + 3 * k] & 0x0F);
      h.has_frame = true;
      h.offset = pos;
      h.mcu_height = components > 1 ? 8 * vmax : 8;
      sequential = m == 0xC0 || m == 0xC1;
    }
    pos += 2 + length;
  }
  return h;
}

}  // namespace io
}  // namespace orbbec
