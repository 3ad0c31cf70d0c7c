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

}  // namespace io
}  // namespace orbbec
