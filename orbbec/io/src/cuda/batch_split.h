// How one batch is divided between the hardware JPEG engine and the hybrid path: arithmetic on the
// images' sizes only (no nvJPEG, no CUDA), so that these rules are read and changed in one place.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace orbbec {
namespace io {

// What the header says about one image, and where it may go.
struct ImagePlan {
  bool ok = false;
  bool hardware = false;  // the hardware engine accepts it
  int64_t height = 0, width = 0;
  int64_t pixels = 0;  // of the output
};

// The batch's images by path (indices into the batch, in batch order) and their output pixels.
struct PathLists {
  std::vector<size_t> hardware, hybrid;
  int64_t hardware_pixels = 0, hybrid_pixels = 0;

  void add(const std::vector<ImagePlan>& plans, size_t i);
  void all_to_hybrid();
};

// Hardware batches in flight at once for the engine's list (0 when it is empty).
int hardware_lanes(const PathLists& paths, int max_lanes);

// The default: large images leave the end of the engine's list, decided by the batch alone (see the
// definition): up to one round of the hybrid threads, or, `overlapped` (the next batch's images
// keep the threads busy while this one finishes), as many as balance the two paths' total times.
// Images of fewer than `min_pixels` output pixels stay on the engine (the decoder's default:
// kShareMinPixels).
// Half a megapixel: 1080p images cut to the rows their warp reads (the loader's partial decoding)
// still qualify, while 640 x 640 and smaller stay on the engine.
constexpr int64_t kShareMinPixels = 500'000;

// The bitstream bytes one job of a batch's header parse covers (Decoder::begin).
constexpr int64_t kParseJobBytes = 1'000'000;
void share_large_images(const std::vector<ImagePlan>& plans, int hybrid_threads, bool overlapped, PathLists& paths,
                        int64_t min_pixels);

// Opt-in (ORBBEC_NVJPEG_SPLIT=1): whole rounds of the hybrid threads move while the measured rates
// (pixels per second) predict a shorter batch.
void split_by_rates(const std::vector<ImagePlan>& plans, int hybrid_threads, double hardware_rate,
                    double hybrid_rate_per_thread, PathLists& paths);

}  // namespace io
}  // namespace orbbec
