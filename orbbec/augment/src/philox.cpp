// numpy's Philox4x64-10 streams for many sample keys at once. orbbec.augment keys one Philox per
// sample (see _random.py); drawing a batch's parameters through numpy's Generator costs a
// DataLoader worker a few microseconds per sample in call overheads, which a batch-wide draw
// (orbbec/augment/_batched.py) avoids by reading the same 64-bit words from here.
#include <torch/extension.h>
#include <pybind11/numpy.h>

#include <cstdint>

namespace py = pybind11;

namespace orbbec {
namespace augment {
namespace {

// The constants and round of Random123's philox4x64, as numpy's Philox uses them.
constexpr uint64_t kM0 = 0xD2E7470EE14C6C93ULL, kM1 = 0xCA5A826395121157ULL;
constexpr uint64_t kW0 = 0x9E3779B97F4A7C15ULL, kW1 = 0xBB67AE8584CAA73BULL;

// The 128-bit product of a and b, from 32-bit halves (no compiler extension needed).
inline uint64_t mulhilo(uint64_t a, uint64_t b, uint64_t* hi) {
  const uint64_t a_lo = a & 0xFFFFFFFFULL, a_hi = a >> 32, b_lo = b & 0xFFFFFFFFULL, b_hi = b >> 32;
  const uint64_t ll = a_lo * b_lo, lh = a_lo * b_hi, hl = a_hi * b_lo, hh = a_hi * b_hi;
  const uint64_t mid = (ll >> 32) + (lh & 0xFFFFFFFFULL) + (hl & 0xFFFFFFFFULL);
  *hi = hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
  return (mid << 32) | (ll & 0xFFFFFFFFULL);
}

void philox_block(uint64_t counter, uint64_t key0, uint64_t key1, uint64_t* out) {
  uint64_t c0 = counter, c1 = 0, c2 = 0, c3 = 0;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kW0;
      key1 += kW1;
    }
    uint64_t hi0, hi1;
    const uint64_t lo0 = mulhilo(kM0, c0, &hi0), lo1 = mulhilo(kM1, c2, &hi1);
    const uint64_t n0 = hi1 ^ c1 ^ key0, n2 = hi0 ^ c3 ^ key1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// The first `words` (a multiple of 4) 64-bit outputs of numpy's Philox(key=[index, run_key]) with
// its counter at zero, for each index: what random_raw() returns after the state is keyed (numpy
// increments the counter before each block of four).
py::array_t<uint64_t> philox_streams(py::array_t<uint64_t, py::array::c_style | py::array::forcecast> indices,
                                     uint64_t run_key, int64_t words) {
  TORCH_CHECK(indices.ndim() == 1, "philox_streams: indices must be 1-D");
  TORCH_CHECK(words > 0 && words % 4 == 0, "philox_streams: words must be a positive multiple of 4, got ", words);
  const int64_t n = indices.shape(0);
  py::array_t<uint64_t> out({n, words});
  const uint64_t* idx = indices.data();
  uint64_t* dst = out.mutable_data();
  {
    py::gil_scoped_release released;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t b = 0; b < words / 4; ++b) philox_block(static_cast<uint64_t>(b + 1), idx[i], run_key,
                                                           dst + i * words + b * 4);
  }
  return out;
}

}  // namespace

void bind(py::module& m) {
  m.def("philox_streams", &philox_streams, py::arg("indices"), py::arg("run_key"), py::arg("words"),
        "numpy Philox(key=[index, run_key]) raw outputs [len(indices), words]");
}

}  // namespace augment
}  // namespace orbbec
