// Does nvJPEG's hardware engine take less host time per image when the bitstreams are already in
// device memory (NVJPEG_BACKEND_HARDWARE_DEVICE) than from host memory (NVJPEG_BACKEND_HARDWARE)?
// Small images are bound by the host work inside nvjpegDecodeBatched (docs/dev/decode.md); this
// measures it outside orbbec, on a file of JPEGs written by hw_device_probe.py.
//
//   nvcc -O2 -std=c++17 -o /tmp/probe tools/dev/hw_device_probe.cu -lnvjpeg -lpthread
//   /tmp/probe FILE MODE LANES BATCH SECONDS
// MODE: host (pageable bitstreams), pinned (bitstreams in page-locked memory), device (one
// cudaMemcpyAsync of the batch's packed bytes from pinned memory per call, then the device backend),
// resident (the device backend on bytes copied once). Each lane is a thread with its own state and
// stream; it waits for its previous batch on the host before the next call (as orbbec's lanes do).
// Prints images/s, host microseconds per image inside nvjpegDecodeBatched, and a checksum of the
// first batch's pixels (equal between modes when they decode the same pixels).
#include <cuda_runtime.h>
#include <nvjpeg.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#define CK(x)                                                                   \
  do {                                                                          \
    auto s_ = (x);                                                              \
    if (static_cast<int>(s_) != 0) {                                            \
      std::fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, (int)s_); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s FILE host|pinned|device|resident LANES BATCH SECONDS\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[2];
  const int lanes = std::atoi(argv[3]), batch = std::atoi(argv[4]);
  const double seconds = std::atof(argv[5]);
  // FILE: uint64 count, uint64 offsets[count + 1], bytes.
  std::ifstream f(argv[1], std::ios::binary);
  uint64_t count = 0;
  f.read(reinterpret_cast<char*>(&count), 8);
  std::vector<uint64_t> off(count + 1);
  f.read(reinterpret_cast<char*>(off.data()), 8 * (count + 1));
  std::vector<unsigned char> bytes(off[count]);
  f.read(reinterpret_cast<char*>(bytes.data()), bytes.size());
  if (!f || count < static_cast<uint64_t>(batch)) {
    std::fprintf(stderr, "bad file or fewer images than a batch\n");
    return 2;
  }

  const bool on_device = mode == "device" || mode == "resident";
  nvjpegHandle_t handle;
  CK(nvjpegCreateEx(on_device ? NVJPEG_BACKEND_HARDWARE_DEVICE : NVJPEG_BACKEND_HARDWARE, nullptr, nullptr,
                    NVJPEG_FLAGS_DEFAULT, &handle));
  // Sizes from the headers (host side, once).
  std::vector<int> width(count), height(count);
  size_t max_pixels = 0;
  for (uint64_t i = 0; i < count; ++i) {
    int nc = 0, w[NVJPEG_MAX_COMPONENT], h[NVJPEG_MAX_COMPONENT];
    nvjpegChromaSubsampling_t css;
    CK(nvjpegGetImageInfo(handle, bytes.data() + off[i], off[i + 1] - off[i], &nc, &css, w, h));
    width[i] = w[0];
    height[i] = h[0];
    max_pixels = std::max(max_pixels, static_cast<size_t>(w[0]) * h[0]);
  }
  unsigned char* pinned = nullptr;  // a page-locked copy of every byte (pinned, device modes)
  if (mode != "host") {
    CK(cudaMallocHost(&pinned, bytes.size()));
    std::memcpy(pinned, bytes.data(), bytes.size());
  }
  unsigned char* resident = nullptr;
  if (mode == "resident") {
    CK(cudaMalloc(&resident, bytes.size()));
    CK(cudaMemcpy(resident, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  }
  const int batches = static_cast<int>(count / batch);
  std::atomic<int64_t> images{0}, call_ns{0};
  std::atomic<bool> stop{false};
  std::atomic<int> next_batch{0};
  double checksum = 0;

  struct Lane {
    nvjpegJpegState_t state;
    cudaStream_t stream;
    cudaEvent_t end;
    unsigned char* out = nullptr;
    unsigned char* staged = nullptr;  // device mode: this lane's copy of its batch's bytes
    std::vector<const unsigned char*> data;
    std::vector<size_t> sizes;
    std::vector<nvjpegImage_t> dst;
  };
  auto make = [&](Lane& L) {
    CK(nvjpegJpegStateCreate(handle, &L.state));
    CK(cudaStreamCreateWithFlags(&L.stream, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&L.end, cudaEventBlockingSync));
    CK(cudaMalloc(&L.out, max_pixels * 3 * batch));
    if (mode == "device") CK(cudaMalloc(&L.staged, bytes.size()));
    CK(nvjpegDecodeBatchedInitialize(handle, L.state, batch, 1, NVJPEG_OUTPUT_RGBI));
    L.data.resize(batch);
    L.sizes.resize(batch);
    L.dst.resize(batch);
  };
  // Decodes batch b on lane L (after waiting for its previous batch); returns the host ns of the call.
  auto decode = [&](Lane& L, int b) -> int64_t {
    const uint64_t lo = off[static_cast<size_t>(b) * batch], hi = off[static_cast<size_t>(b + 1) * batch];
    CK(cudaEventSynchronize(L.end));  // the lane's previous batch has left the engine
    const auto t0 = Clock::now();
    if (mode == "device") CK(cudaMemcpyAsync(L.staged, pinned + lo, hi - lo, cudaMemcpyHostToDevice, L.stream));
    for (int k = 0; k < batch; ++k) {
      const size_t i = static_cast<size_t>(b) * batch + k;
      L.data[k] = mode == "host"     ? bytes.data() + off[i]
                  : mode == "pinned" ? pinned + off[i]
                  : mode == "device" ? L.staged + (off[i] - lo)
                                     : resident + off[i];
      L.sizes[k] = off[i + 1] - off[i];
      L.dst[k] = nvjpegImage_t{};
      L.dst[k].channel[0] = L.out + max_pixels * 3 * k;
      L.dst[k].pitch[0] = static_cast<size_t>(width[i]) * 3;
    }
    CK(nvjpegDecodeBatched(handle, L.state, L.data.data(), L.sizes.data(), L.dst.data(), L.stream));
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    CK(cudaEventRecord(L.end, L.stream));
    return ns;
  };
  {  // the checksum of batch 0's pixels
    Lane L;
    make(L);
    decode(L, 0);
    CK(cudaEventSynchronize(L.end));
    std::vector<unsigned char> host(max_pixels * 3 * batch);
    CK(cudaMemcpy(host.data(), L.out, host.size(), cudaMemcpyDeviceToHost));
    for (int k = 0; k < batch; ++k)
      for (size_t p = 0; p < static_cast<size_t>(width[k]) * height[k] * 3; ++p)
        checksum += host[max_pixels * 3 * k + p] * ((p % 7) + 1);
  }
  auto lane = [&](int) {
    Lane L;
    make(L);
    while (!stop.load()) {
      call_ns += decode(L, next_batch.fetch_add(1) % batches);
      images += batch;
    }
    CK(cudaEventSynchronize(L.end));
  };

  // Warm-up of one second, then the timed window.
  std::vector<std::thread> threads;
  for (int l = 0; l < lanes; ++l) threads.emplace_back(lane, l);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  const int64_t i0 = images.load(), c0 = call_ns.load();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(seconds * 1000)));
  const int64_t i1 = images.load(), c1 = call_ns.load();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  stop = true;
  for (auto& t : threads) t.join();
  std::printf("%-8s lanes %d batch %3d: %9.0f img/s  %6.1f us host per image in the call  checksum %.0f\n",
              mode.c_str(), lanes, batch, (i1 - i0) / wall, (c1 - c0) / 1e3 / std::max<int64_t>(i1 - i0, 1),
              checksum);
  return 0;
}
