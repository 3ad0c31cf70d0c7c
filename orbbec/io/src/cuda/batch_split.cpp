#include "io/src/cuda/batch_split.h"

#include <algorithm>

namespace orbbec {
namespace io {

void PathLists::add(const std::vector<ImagePlan>& plans, size_t i) {
  (plans[i].hardware ? hardware : hybrid).push_back(i);
  (plans[i].hardware ? hardware_pixels : hybrid_pixels) += plans[i].pixels;
}

void PathLists::all_to_hybrid() {
  hybrid.insert(hybrid.end(), hardware.begin(), hardware.end());
  hybrid_pixels += hardware_pixels;
  hardware.clear();
  hardware_pixels = 0;
}

// Small images are limited by the host's submission of each batch, so they gain from several lanes
// (500 x 375, H100: 2 lanes about 20k img/s, 3 lanes 21-29k); 1080p images lost 8% with two.
int hardware_lanes(const PathLists& paths, int max_lanes) {
  if (paths.hardware.empty()) return 0;
  const double mean_pixels = static_cast<double>(paths.hardware_pixels) / paths.hardware.size();
  return std::clamp(static_cast<int>(1e6 / std::max(1.0, mean_pixels)), 1,
                    std::min<int>(max_lanes, std::max<int>(1, paths.hardware.size() / 8)));
}

// The engine's time grows with the pixels of a batch; a hybrid thread decodes one whole image at a
// time. Moving large images off the end of the engine's list shortens a batch of 1080p images while
// the engine still has more to do than the hybrid threads (64 images, H100: 5,551-5,970 ->
// 5,965-6,626 img/s in one call with one round, docs/dev/decode.md). A single call waits for its
// hybrid images, so it moves at most one round (one image per hybrid thread); when the next batch
// overlaps this one (`overlapped`), the threads go on to its images, and the hybrid path's time is
// its images' total time spread over the threads. The share is decided by the batch alone (its
// images' sizes and order), the thread count and `overlapped`, with fixed model rates, never by
// timing: the two paths' pixels differ slightly, and the same batch must always decode to the same
// bits. Images under `min_pixels` (kShareMinPixels unless ORBBEC_NVJPEG_SHARE_MIN_PIXELS says otherwise)
// stay on the engine: with them a share was slower on the H100, and on the H200 it sped up decoding
// alone at 500 x 375 but slowed the loader (the hybrid threads, the engine's submission, the
// loader's workers and threads then compete for the host's cores).
void share_large_images(const std::vector<ImagePlan>& plans, int hybrid_threads, bool overlapped, PathLists& paths,
                        int64_t min_pixels) {
  // Model rates fitted to the H100's engine alone and its hybrid threads alone, on 1080p and 500 x 375.
  auto engine_s = [](int64_t px) { return 19e-6 + static_cast<double>(px) / 14e9; };
  auto thread_s = [](int64_t px) { return 0.37e-3 + static_cast<double>(px) / 0.38e9; };
  auto& hardware = paths.hardware;
  // One thread less than the pool's hybrid share: the caller's thread and the engine's submission
  // need cores too (a full round of 13 on 16 cores was slower than 12 on the H100).
  const size_t threads = static_cast<size_t>(std::max(1, hybrid_threads - 1));
  size_t room = overlapped ? hardware.size() : (paths.hybrid.size() < threads ? threads - paths.hybrid.size() : 0);
  if (room == 0 || hardware.size() < 2) return;
  // The hybrid path's time with one more image of `px` pixels.
  auto with = [&](double hybrid, int64_t px) {
    return overlapped ? hybrid + thread_s(px) / threads : std::max(hybrid, thread_s(px));
  };
  double engine = 0, hybrid = 0;
  for (size_t i : hardware) engine += engine_s(plans[i].pixels);
  for (size_t i : paths.hybrid) hybrid = with(hybrid, plans[i].pixels);
  std::vector<bool> moved(hardware.size(), false);
  size_t kept = hardware.size();
  for (size_t k = hardware.size(); k-- > 0 && room > 0 && kept > 1;) {
    const int64_t px = plans[hardware[k]].pixels;
    if (px < min_pixels) continue;
    const double next_engine = engine - engine_s(px), next_hybrid = with(hybrid, px);
    if (std::max(next_engine, next_hybrid) >= std::max(engine, hybrid)) break;
    engine = next_engine;
    hybrid = next_hybrid;
    moved[k] = true;
    --room;
    --kept;
  }
  std::vector<size_t> stay;
  for (size_t k = 0; k < hardware.size(); ++k) {
    if (!moved[k]) {
      stay.push_back(hardware[k]);
      continue;
    }
    paths.hybrid.push_back(hardware[k]);
    paths.hybrid_pixels += plans[hardware[k]].pixels;
    paths.hardware_pixels -= plans[hardware[k]].pixels;
  }
  hardware.swap(stay);
}

// Images move from the engine's list to the hybrid path in whole rounds of the hybrid threads (a
// thread decodes one whole image at a time, so a partial round costs as much as a full one), while
// that shortens the batch's predicted time: the longer of the two paths'. Rates: the engine's from
// its events (EngineClock), a hybrid thread's from its host time.
void split_by_rates(const std::vector<ImagePlan>& plans, int hybrid_threads, double hardware_rate,
                    double hybrid_rate_per_thread, PathLists& paths) {
  auto& hardware = paths.hardware;
  auto& hybrid = paths.hybrid;
  auto hybrid_time = [&](size_t count, int64_t pixels) {
    if (count == 0) return 0.0;
    const double rounds = static_cast<double>((count + hybrid_threads - 1) / hybrid_threads);
    return rounds * (static_cast<double>(pixels) / count) / hybrid_rate_per_thread;
  };
  double best = std::max(hybrid_time(hybrid.size(), paths.hybrid_pixels), paths.hardware_pixels / hardware_rate);
  while (hardware.size() > 1) {
    const size_t round_end = (hybrid.size() / hybrid_threads + 1) * hybrid_threads;
    const size_t take = std::min(round_end - hybrid.size(), hardware.size() - 1);
    int64_t px = 0;
    for (size_t k = hardware.size() - take; k < hardware.size(); ++k) px += plans[hardware[k]].pixels;
    const double t = std::max(hybrid_time(hybrid.size() + take, paths.hybrid_pixels + px),
                              (paths.hardware_pixels - px) / hardware_rate);
    if (t >= best) break;
    best = t;
    hybrid.insert(hybrid.end(), hardware.end() - take, hardware.end());
    hardware.resize(hardware.size() - take);
    paths.hybrid_pixels += px;
    paths.hardware_pixels -= px;
  }
}

}  // namespace io
}  // namespace orbbec
