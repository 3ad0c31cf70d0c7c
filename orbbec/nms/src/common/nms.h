// Box arithmetic of the NMS ops, shared by the CPU and CUDA kernels so that both devices make the
// same decision for every pair of boxes (docs/nms.md states the conventions).
//
// IoU follows torchvision: area = (x2 - x1) * (y2 - y1) (no +1), inter = w * h with
// w = max(min(x2a, x2b) - max(x1a, x1b), 0), iou = inter / ((area_a + area_b) - inter), all in
// the accumulation type T (float32 for float16/bfloat16/float32 boxes, float64 for float64 boxes).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/src/arith.h"

namespace orbbec {
namespace nms {

// Boxes per mask word: one bit per box of a 64-box column tile.
constexpr int kTile = 64;

enum SoftMethod : int64_t { kLinear = 1, kGaussian = 2 };  // the reference code's numbering

template <typename T>
struct alignas(4 * sizeof(T)) Box {
  T x1, y1, x2, y2;
};

// Plain selects, identical on both devices (fminf/fmaxf may differ on signed zeros).
template <typename T> ORBBEC_HD T min_of(T a, T b) { return b < a ? b : a; }
template <typename T> ORBBEC_HD T max_of(T a, T b) { return a < b ? b : a; }

// Replaces a box that has a non-finite coordinate, x2 < x1, y2 < y1 or a non-finite area by the
// empty box (+inf, +inf, -inf, -inf), whose intersection with any box is 0; returns the area (0 for
// such boxes). After this every IoU is a number in [0, 1], never NaN.
template <typename T>
ORBBEC_HD T sanitize(Box<T>& b) {
  const T area = mul_rn(sub_rn(b.x2, b.x1), sub_rn(b.y2, b.y1));
  const bool ok = is_finite(b.x1) && is_finite(b.y1) && is_finite(b.x2) && is_finite(b.y2) &&
                  b.x2 >= b.x1 && b.y2 >= b.y1 && is_finite(area);
  if (ok) return area;
  const T inf = std::numeric_limits<T>::infinity();
  b = Box<T>{inf, inf, -inf, -inf};
  return T(0);
}

// Width (or height) of the intersection of two sanitized intervals: never NaN, since the highs
// are finite or -inf and the lows finite or +inf.
template <typename T>
ORBBEC_HD T overlap(T lo_a, T hi_a, T lo_b, T hi_b) {
  return sub_rn(min_of(hi_a, hi_b), max_of(lo_a, lo_b));
}

// IoU of two sanitized boxes with their areas. The union is >= 0 and is 0 only when both areas
// are 0, in which case the intersection is 0 too: dividing by 1 then gives IoU 0 without a branch
// (so the CPU loop vectorizes).
template <typename T>
ORBBEC_HD T iou(const Box<T>& a, T area_a, const Box<T>& b, T area_b) {
  const T w = max_of(overlap(a.x1, a.x2, b.x1, b.x2), T(0));
  const T h = max_of(overlap(a.y1, a.y2, b.y1, b.y2), T(0));
  const T inter = mul_rn(w, h);
#if defined(__CUDA_ARCH__)
  // 0 / x is 0 (the sign of a zero decides nothing here): returning early skips the GPU division's
  // slow path, which a zero dividend takes, and most pairs of boxes do not intersect.
  if (inter == T(0)) return T(0);
#endif
  const T uni = sub_rn(add_rn(area_a, area_b), inter);
  return div_rn(inter, uni > T(0) ? uni : T(1));
}

// Soft-NMS decay factor of a box whose intersection with the selected box is not empty
// (Bodla et al. 2017, reference code): linear 1 - iou when iou > Nt, else 1; gaussian
// exp(-iou^2 / sigma), the exponent in T and the exponential in double, as the reference does.
template <typename T>
ORBBEC_HD T soft_weight(T ov, int64_t method, T nt_below, T sigma) {
  if (method == kLinear) return ov > nt_below ? sub_rn(T(1), ov) : T(1);
  const T e = div_rn(-mul_rn(ov, ov), sigma);
#if defined(__CUDA_ARCH__)
  return static_cast<T>(::exp(static_cast<double>(e)));
#else
  return static_cast<T>(std::exp(static_cast<double>(e)));
#endif
}

// Ranking of (score, index) pairs: higher score first, NaN above every number (torch.sort's
// descending order), ties by lower index. An index < 0 is "no box" and ranks last.
template <typename T>
ORBBEC_HD bool ranks_before(T sa, int64_t ia, T sb, int64_t ib) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
  const bool na = sa != sa, nb = sb != sb;
  if (na != nb) return na;
  if (!na && sa != sb) return sa > sb;
  return ia < ib;
}

// Thresholds in the accumulation type that give exactly the comparison with the float64
// threshold: for a float v, v > t <=> v > below(t) (largest float <= t), and
// v < t <=> v < above(t) (smallest float >= t). Host only.
template <typename T>
inline T threshold_below(double t) {
  T f = static_cast<T>(t);
  if (static_cast<double>(f) > t) f = std::nextafter(f, -std::numeric_limits<T>::infinity());
  return f;
}
template <typename T>
inline T threshold_above(double t) {
  T f = static_cast<T>(t);
  if (static_cast<double>(f) < t) f = std::nextafter(f, std::numeric_limits<T>::infinity());
  return f;
}

}  // namespace nms
}  // namespace orbbec
