"""Independent references for the warp tests: random matrices of the kinds users feed, and a plain
float64 numpy warp (no code shared with orbbec's kernels)."""
import cv2
import numpy as np

CV2_INTERP = {"nearest": cv2.INTER_NEAREST, "bilinear": cv2.INTER_LINEAR, "bicubic": cv2.INTER_CUBIC}
CV2_BORDER = {
    "constant": cv2.BORDER_CONSTANT,
    "replicate": cv2.BORDER_REPLICATE,
    "reflect": cv2.BORDER_REFLECT,
    "reflect101": cv2.BORDER_REFLECT_101,
    "wrap": cv2.BORDER_WRAP,
}


def random_matrix(rng, in_hw, out_hw):
    """A forward (src -> dst) matrix centring the input in the output with a random rotation, shear,
    anisotropic up- or down-scaling, an occasional mirror and a sub-pixel shift."""
    (H, W), (OH, OW) = in_hw, out_hw
    angle = np.deg2rad(rng.uniform(-180, 180))
    base = min(OH / H, OW / W)
    sx, sy = base * rng.uniform(0.5, 2.0), base * rng.uniform(0.5, 2.0)
    shear = rng.uniform(-0.3, 0.3)
    mirror = -1.0 if rng.uniform() < 0.25 else 1.0
    R = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    A = R @ np.array([[1.0, shear], [0.0, 1.0]]) @ np.diag([sx * mirror, sy])
    centre_in = np.array([(W - 1) / 2, (H - 1) / 2])
    centre_out = np.array([(OW - 1) / 2, (OH - 1) / 2]) + rng.uniform(-0.15, 0.15, 2) * [OW, OH]
    t = centre_out - A @ centre_in + rng.uniform(-0.5, 0.5, 2)
    return np.hstack([A, t[:, None]])


def _border_index(p, n, mode):
    if mode == "replicate":
        return np.clip(p, 0, n - 1)
    if mode == "wrap":
        return np.mod(p, n)
    if n == 1:
        return np.zeros_like(p)
    if mode == "reflect":
        q = np.mod(p, 2 * n)
        return np.where(q < n, q, 2 * n - 1 - q)
    q = np.mod(p, 2 * n - 2)  # reflect101
    return np.where(q < n, q, 2 * n - 2 - q)


def _cubic(t):
    A = -0.75
    t = np.asarray(t)
    w0 = ((A * (t + 1) - 5 * A) * (t + 1) + 8 * A) * (t + 1) - 4 * A
    w1 = ((A + 2) * t - (A + 3)) * t * t + 1
    w2 = ((A + 2) * (1 - t) - (A + 3)) * (1 - t) * (1 - t) + 1
    return [w0, w1, w2, 1 - w0 - w1 - w2]


def warp_reference(img, inv_m, out_hw, interp, border, border_value=0.0):
    """float64 warp of one HxWxC image: dst(x, y) = img(inv_m @ (x, y, 1)), cv2's conventions."""
    img = img.astype(np.float64)
    H, W, C = img.shape
    OH, OW = out_hw
    ys, xs = np.mgrid[0:OH, 0:OW].astype(np.float64)
    sx = inv_m[0, 0] * xs + inv_m[0, 1] * ys + inv_m[0, 2]
    sy = inv_m[1, 0] * xs + inv_m[1, 1] * ys + inv_m[1, 2]
    bval = np.broadcast_to(np.asarray(border_value, np.float64), (C,))

    def tap(ix, iy):
        inside = (ix >= 0) & (ix < W) & (iy >= 0) & (iy < H)
        if border == "constant":
            v = img[np.clip(iy, 0, H - 1), np.clip(ix, 0, W - 1)]
            return np.where(inside[..., None], v, bval)
        return img[_border_index(iy, H, border), _border_index(ix, W, border)]

    if interp == "nearest":
        return tap(np.rint(sx).astype(np.int64), np.rint(sy).astype(np.int64))
    x0, y0 = np.floor(sx).astype(np.int64), np.floor(sy).astype(np.int64)
    fx, fy = (sx - x0)[..., None], (sy - y0)[..., None]
    if interp == "bilinear":
        top = tap(x0, y0) * (1 - fx) + tap(x0 + 1, y0) * fx
        bottom = tap(x0, y0 + 1) * (1 - fx) + tap(x0 + 1, y0 + 1) * fx
        return top * (1 - fy) + bottom * fy
    wx, wy = _cubic(fx), _cubic(fy)
    out = np.zeros((OH, OW, C))
    for j in range(4):
        row = sum(wx[i] * tap(x0 - 1 + i, y0 - 1 + j) for i in range(4))
        out += wy[j] * row
    return out
