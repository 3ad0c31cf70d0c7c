#!/usr/bin/env python
"""md5 digests of warp_affine outputs, to show that a change keeps every output bit-identical.

Run it on the build before a change and on the build after, then compare the files:

    PYTHONPATH=$PWD python tools/dev/warp_digest.py --device cuda --out before.txt   # old build
    PYTHONPATH=$PWD python tools/dev/warp_digest.py --device cuda --out after.txt    # new build
    diff before.txt after.txt && echo identical

One line per case: name, md5 of the output bytes, shape, dtype and memory layout. Cases cover every
input dtype, interpolation, border mode and layout with 1, 3 and 4 channels, the fused output
(dtypes, normalisation, channel reversal, output layouts), lists of images of different sizes, and
batches shaped like the benchmark workloads (docs/workloads.md) so the 3-channel CUDA kernel runs its
multi-tile paths. Inputs are photographs (scikit-image's samples, cropped, scaled and mirrored, no
seams) with per-image random rotations, scales and shifts from fixed seeds; some matrices send part
of the output off the image. Only the public API is used (orbbec.warpaffine.warp_affine with names
for the modes), so the same file runs on old and new builds. CPU and CUDA builds give the same
digests (the tests require it), so a CPU run is a reference too.

With --backward it digests the gradients instead: grad_src and grad_matrix from autograd through the
plain warp (inverse_map=True, so grad_matrix is the kernel's own) with a fixed random upstream
gradient that holds some exact zeros, over the float dtypes, interpolations, border modes, layouts
and 1 or 3 channels, and with only one of the two gradients asked for. Two families:

- "general": random rotations, scales and shears, some upsampling. The CPU backward sums in a fixed
  order, so these are exact references there. The CUDA backward scatters with atomics in an order
  that changes from run to run, so its general digests need not repeat.
- "exact": matrices and values chosen so that every product and sum is exact (dyadic fractions
  with few bits: scales of 1, 2 and 1/2, quarter-turns, half-pixel offsets, upstream gradients in
  quarters). The order of the additions cannot change a bit, so these digests repeat on CUDA and
  equal the CPU's. On CUDA, compare these:  --backward --exact-only.
"""
from __future__ import annotations

import argparse
import hashlib
import sys

import numpy as np
import torch

from orbbec.warpaffine import warp_affine

DTYPES = ("uint8", "float16", "bfloat16", "float32", "float64")
INTERPOLATIONS = ("nearest", "bilinear", "bicubic")
BORDERS = ("constant", "replicate", "reflect", "wrap", "reflect101")


def photographs(count: int, h: int, w: int, seed: int) -> np.ndarray:
    """[count, h, w, 3] uint8 BGR photographs without seams: h x w windows at random offsets into the
    four sample photographs (scikit-image) resized to 1.5 times that size, every other one mirrored.
    Self-contained, so that this file alone runs against an old build."""
    import cv2
    from skimage import data

    names = ("astronaut", "chelsea", "coffee", "rocket")
    big = [cv2.resize(getattr(data, n)()[:, :, ::-1], (w * 3 // 2, h * 3 // 2), interpolation=cv2.INTER_AREA)
           for n in names]
    rng = np.random.default_rng(seed)
    ys = rng.integers(0, h * 3 // 2 - h + 1, count)
    xs = rng.integers(0, w * 3 // 2 - w + 1, count)
    windows = [big[i % 4][ys[i]:ys[i] + h, xs[i]:xs[i] + w] for i in range(count)]
    return np.ascontiguousarray(np.stack([win[:, ::-1] if i % 2 else win for i, win in enumerate(windows)]))


def matrices(count: int, in_hw, out_hw, seed: int, spread: float = 0.1) -> np.ndarray:
    """cv2-convention (src -> dst) matrices [count, 2, 3] float64: rotation in [-45, 45] degrees, an
    anisotropic scale around the fit of the input into the output, a shear, a shift of up to
    `spread` of the output size and a sub-pixel jitter; every third image mirrored."""
    rng = np.random.default_rng(seed)
    (h, w), (oh, ow) = in_hw, out_hw
    out = []
    for i in range(count):
        a = np.radians(rng.uniform(-45, 45))
        fit = min(oh / h, ow / w)
        sx, sy = fit * rng.uniform(0.7, 1.4), fit * rng.uniform(0.7, 1.4)
        if i % 3 == 2:
            sx = -sx
        shear = rng.uniform(-0.2, 0.2)
        A = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]) @ np.array([[sx, shear * sx], [0, sy]])
        c_in = np.array([w / 2, h / 2])
        c_out = np.array([ow / 2, oh / 2]) + rng.uniform(-spread, spread, 2) * np.array([ow, oh])
        t = c_out - A @ c_in + rng.uniform(-0.5, 0.5, 2)
        out.append(np.hstack([A, t[:, None]]))
    return np.stack(out)


def as_dtype(x_u8: torch.Tensor, dtype: str) -> torch.Tensor:
    if dtype == "uint8":
        return x_u8
    # values in [0, 255] with fractions, so float images are not just integers
    return (x_u8.double() * (255.0 / 256.0) + 0.25).to(getattr(torch, dtype))


def digest(t: torch.Tensor) -> str:
    layout = "NHWC" if (t.dim() == 4 and t.shape[1] > 1 and not t.is_contiguous()
                        and t.is_contiguous(memory_format=torch.channels_last)) else "NCHW"
    raw = t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    return f"{hashlib.md5(raw).hexdigest()} {list(t.shape)} {str(t.dtype).replace('torch.', '')} {layout}"


def cases(device: str, quick: bool):
    """Yields (name, function returning the output)."""
    dev = torch.device(device)

    def batch(count, h, w, seed, channels=3):
        x = torch.from_numpy(photographs(count, h, w, seed)).permute(0, 3, 1, 2)
        if channels == 1:
            x = x[:, 1:2]
        elif channels == 4:
            x = torch.cat([x, x[:, :1].flip(-1)], 1)  # a fourth plane (mirrored blue)
        return x.contiguous().to(dev)

    # Every dtype x interpolation x border x layout x channels, small batches. 101 x 131: planes an odd
    # number of bytes long; 96 x 128: word-aligned planes (both paths of the 3-channel kernel).
    for h, w in ((101, 131), (96, 128)):
        for channels in (1, 3, 4):
            x8 = batch(4, h, w, seed=h + channels, channels=channels)
            M = torch.from_numpy(matrices(4, (h, w), (72, 88), seed=w + channels, spread=0.25)).to(dev)
            values = [7.0, 130.0, 300.0, -2.0][:channels] if channels > 1 else [77.0]
            for dtype in DTYPES:
                x = as_dtype(x8, dtype)
                for layout in ("NCHW", "NHWC"):
                    xl = x if layout == "NCHW" else x.contiguous(memory_format=torch.channels_last)
                    for interp in INTERPOLATIONS:
                        for border in BORDERS:
                            if quick and (dtype not in ("uint8", "float32") or h != 101):
                                continue
                            name = f"{h}x{w} C{channels} {dtype} {layout} {interp} {border}"
                            yield name, lambda xl=xl, M=M, interp=interp, border=border, values=values: warp_affine(
                                xl, M, (88, 72), interpolation=interp, border_mode=border, border_value=values)
            # inverse maps and one shared matrix
            x = x8 if channels != 3 else x8.contiguous(memory_format=torch.channels_last)
            inv = torch.from_numpy(matrices(1, (72, 88), (h, w), seed=channels)[0]).to(dev)
            yield f"{h}x{w} C{channels} uint8 inverse_map shared", lambda x=x, inv=inv: warp_affine(
                x, inv, (88, 72), inverse_map=True, border_mode="replicate")

    # The fused output: dtypes, normalisation, channel reversal, layouts, from NCHW and NHWC inputs.
    x8 = batch(6, 120, 150, seed=11)
    M = torch.from_numpy(matrices(6, (120, 150), (80, 96), seed=12, spread=0.2)).to(dev)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    for in_layout in ("NCHW", "NHWC"):
        xl = x8 if in_layout == "NCHW" else x8.contiguous(memory_format=torch.channels_last)
        for out_dtype in (torch.float32, torch.float16, torch.bfloat16, torch.uint8):
            for out_layout in ("NCHW", "NHWC"):
                for reverse in (False, True):
                    for border in ("constant", "reflect101"):
                        norm = out_dtype != torch.uint8
                        name = (f"fused {in_layout}->{out_layout} {str(out_dtype).replace('torch.', '')} "
                                f"reverse={reverse} {border}")
                        yield name, lambda xl=xl, od=out_dtype, ol=out_layout, r=reverse, b=border, n=norm: warp_affine(
                            xl, M, (96, 80), border_mode=b, border_value=[7, 130, 300], out_dtype=od,
                            scale=1 / 255 if n else 1.0, mean=mean if n else None, std=std if n else None,
                            reverse_channels=r, out_layout=ol)
    # Lists of HWC images of different sizes, one launch.
    shapes = [(75, 100), (96, 128), (67, 100), (100, 75), (85, 128), (128, 96)]
    imgs = [torch.from_numpy(photographs(1, h, w, seed=20 + i)[0]).to(dev) for i, (h, w) in enumerate(shapes)]
    Ml = torch.from_numpy(np.stack([matrices(1, hw, (64, 64), seed=30 + i)[0] for i, hw in enumerate(shapes)])).to(dev)
    for out_dtype in (torch.uint8, torch.float32):
        yield f"list {str(out_dtype).replace('torch.', '')}", lambda od=out_dtype: warp_affine(
            imgs, Ml, (64, 64), out_dtype=od, reverse_channels=True)

    # Batches shaped like the benchmark workloads (face, det): many tiles per block on a large GPU.
    for name, count, (h, w), (oh, ow) in (("face", 128, (250, 250), (112, 112)), ("det", 64, (640, 640), (640, 640))):
        if quick and name == "det":
            continue
        x8 = batch(count, h, w, seed=40)
        M = torch.from_numpy(matrices(count, (h, w), (oh, ow), seed=41)).to(dev)
        for layout in ("NCHW", "NHWC"):
            xl = x8 if layout == "NCHW" else x8.contiguous(memory_format=torch.channels_last)
            yield f"{name} uint8 {layout}", lambda xl=xl, M=M, oh=oh, ow=ow: warp_affine(xl, M, (ow, oh))
            yield f"{name} fused float32 {layout}", lambda xl=xl, M=M, oh=oh, ow=ow: warp_affine(
                xl, M, (ow, oh), out_dtype=torch.float32, scale=1 / 255, mean=mean, std=std, reverse_channels=True)


BACKWARD_DTYPES = ("float16", "bfloat16", "float32", "float64")


def upstream(shape, seed: int, exact: bool) -> torch.Tensor:
    """A fixed upstream gradient (float64, on the CPU): standard normal, or whole quarters in [-2, 2]
    for the exact family; every seventh element an exact zero (the kernels skip those)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(-8, 9, shape, generator=g).double() / 4 if exact else torch.randn(shape, generator=g,
                                                                                        dtype=torch.float64)
    t.view(-1)[::7] = 0
    return t


def exact_matrices(count: int, h: int, w: int) -> np.ndarray:
    """Inverse maps (output pixel -> input position) [count, 2, 3] whose coordinates are halves or
    whole numbers: shifts, quarter-turns, mirrors and scales of 2 and 1/2, some reaching past the image."""
    mats = [
        [[1, 0, 0.5], [0, 1, -1.5]],
        [[0, -1, w - 0.5], [1, 0, 0.5]],
        [[2, 0, -3.5], [0, 0.5, 1.0]],
        [[-0.5, 0, w + 2.5], [0, -2, h + 4.5]],
    ]
    return np.array([mats[i % len(mats)] for i in range(count)], dtype=np.float64)


def backward_cases(device: str, quick: bool, exact_only: bool):
    """Yields (name, function returning (grad_src, grad_matrix)); a gradient not asked for is None."""
    dev = torch.device(device)
    families = [("exact", 20, 24, (16, 16))]
    if not exact_only:
        families.insert(0, ("general", 37, 45, (40, 48)))
    for family, h, w, (oh, ow) in families:
        exact = family == "exact"
        for channels in (1, 3):
            x8 = torch.from_numpy(photographs(4, h, w, seed=h + channels)).permute(0, 3, 1, 2)
            x8 = (x8[:, 1:2] if channels == 1 else x8).contiguous()
            if exact:
                M = torch.from_numpy(exact_matrices(4, h, w))
            else:  # inverse maps of the forward cases' random matrices
                M = torch.from_numpy(matrices(4, (oh, ow), (h, w), seed=w + channels, spread=0.25))
            values = [7.0, 130.5, -2.25][:channels]
            go64 = upstream((4, channels, oh, ow), seed=oh + channels, exact=exact)
            for dtype in BACKWARD_DTYPES:
                if quick and dtype not in ("float32", "float16"):
                    continue
                x = as_dtype(x8, dtype)
                for layout in ("NCHW", "NHWC"):
                    fmt = torch.contiguous_format if layout == "NCHW" else torch.channels_last
                    for interp in INTERPOLATIONS:
                        for border in BORDERS:
                            needs = [(True, True)]
                            if interp == "bilinear" and border == "reflect":
                                needs += [(True, False), (False, True)]
                            for need_src, need_mat in needs:
                                only = "" if need_src and need_mat else (" src only" if need_src else " matrix only")
                                name = f"backward {family} C{channels} {dtype} {layout} {interp} {border}{only}"
                                yield name, lambda x=x, M=M, fmt=fmt, go64=go64, interp=interp, border=border, \
                                    values=values, need_src=need_src, need_mat=need_mat: gradients(
                                        x, M, go64, fmt, dev, interp, border, values, need_src, need_mat)


def gradients(x, M, go64, fmt, dev, interp, border, values, need_src, need_mat):
    # fresh leaves: the cases share x and M
    xs = x.to(dev).contiguous(memory_format=fmt).clone().requires_grad_(need_src)
    Ms = M.to(dev).clone().requires_grad_(need_mat)
    out = warp_affine(xs, Ms, (go64.shape[3], go64.shape[2]), interpolation=interp, border_mode=border,
                      border_value=values, inverse_map=True)
    go = go64.to(device=dev, dtype=x.dtype).contiguous(memory_format=fmt)
    out.backward(go)
    return xs.grad if need_src else None, Ms.grad if need_mat else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None, help="write the digests here (else print them)")
    parser.add_argument("--quick", action="store_true",
                        help="uint8 and float32 only, no det batch (backward: float32 and float16 only)")
    parser.add_argument("--backward", action="store_true", help="digest grad_src and grad_matrix instead")
    parser.add_argument("--exact-only", action="store_true",
                        help="with --backward: only the cases whose gradients repeat on CUDA")
    args = parser.parse_args()
    lines = []
    if args.backward:
        for name, fn in backward_cases(args.device, args.quick, args.exact_only):
            grads = fn()
            lines.append(f"{name}: " + " | ".join("-" if g is None else digest(g) for g in grads))
    else:
        for name, fn in cases(args.device, args.quick):
            lines.append(f"{name}: {digest(fn())}")
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        print(f"warp_digest: {len(lines)} outputs on {args.device}, written to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
