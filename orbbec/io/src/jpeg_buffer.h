// What can be told about an encoded image from its bytes alone, before any decoder sees it. Both
// decode paths (nvJPEG on the GPU, OpenCV on the CPU) apply these rules, so a buffer is refused with
// the same words whichever device was asked for.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace orbbec {
namespace io {

// Empty when the buffer may be a complete JPEG; otherwise why not: "empty buffer", "not a JPEG
// (PNG signature)", "truncated: no end-of-image marker", "frame header claims W x H pixels, more
// than a file of N bytes can hold". Entropy-coded data is not checked here: damage inside the scan
// is found (or not) by the decoder itself, as with libjpeg.
std::string jpeg_buffer_problem(const uint8_t* data, size_t size);

// What a JPEG's header segments say, read up to its first scan (markers only: cheap enough for
// every image in the DataLoader workers).
struct JpegHeader {
  // The size the first frame header claims (0 x 0 when there is none) and whether that frame is
  // Huffman-coded (SOF0-SOF7; SOF9 and up are arithmetic-coded).
  uint64_t claimed_width = 0, claimed_height = 0;
  bool huffman = false;
  // A complete frame header (its components readable, a size above 0): the claimed size is the
  // frame's, and the fields below are set.
  bool has_frame = false;
  size_t offset = 0;       // of the frame header's FF byte
  uint32_t mcu_height = 8;  // rows of one row of MCUs
  // Huffman-coded sequential, every component in the first scan: the image is coded MCU row after
  // MCU row from the top, so a smaller height in the frame header stops a decoder after those rows.
  bool rows_cuttable = false;
};
JpegHeader read_jpeg_header(const uint8_t* data, size_t size);

// jpeg_buffer_problem with the buffer's header already read (the loader's workers need both).
std::string jpeg_buffer_problem(const uint8_t* data, size_t size, const JpegHeader& header);

}  // namespace io
}  // namespace orbbec
