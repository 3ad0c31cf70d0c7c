#!/usr/bin/env python
"""Benchmark of orbbec's warp_affine beside its peers, in one run, on the workloads of
docs/workloads.md (face, det, hd): orbbec CUDA (NCHW and channels_last), F.affine_grid +
F.grid_sample (uint8 -> float -> uint8, as kornia does it), torchvision v2 affine (when
installed), cv2.warpAffine on the CPU with all threads and with one, and a device-to-device copy
for the bandwidth figure. Prints a markdown table last and writes it to --out.

    python tools/benchmark_warpaffine.py --out docs/benchmark_warpaffine.md
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import cuda_time_ms, emit_table, host_time_ms  # noqa: E402
from workloads import VARSIZE_SHAPES, WARP_WORKLOADS, forward_matrices, photos_bgr  # noqa: E402



def copy_bandwidth_gbs(reps: int) -> float:
    """Device-to-device copy of 1 GiB: 2 GiB moved (read + written) per copy."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    ms = cuda_time_ms(lambda: dst.copy_(src), reps)
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def grid_sample_warp(x_u8: torch.Tensor, inv: torch.Tensor, oh: int, ow: int) -> torch.Tensor:
    """The affine_grid + grid_sample path (kornia's warp_affine does this), uint8 in and out."""
    B, _, H, W = x_u8.shape
    # pixel -> normalised coordinates (align_corners=False): u = (2x + 1) / W - 1
    def to_norm(w, h):
        return torch.tensor([[2.0 / w, 0, 1.0 / w - 1], [0, 2.0 / h, 1.0 / h - 1], [0, 0, 1]],
                            dtype=torch.float64, device=inv.device)
    inv3 = torch.cat([inv, torch.tensor([0, 0, 1.0], dtype=inv.dtype, device=inv.device).expand(B, 1, 3)], 1)
    theta = (to_norm(W, H) @ inv3 @ torch.linalg.inv(to_norm(ow, oh)))[:, :2].float()
    grid = F.affine_grid(theta, (B, x_u8.shape[1], oh, ow), align_corners=False)
    out = F.grid_sample(x_u8.float(), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def cv2_batch(imgs, mats, ow, oh, threads: int):
    import cv2

    cv2.setNumThreads(1)
    def one(i):
        return cv2.warpAffine(imgs[i], mats[i], (ow, oh), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)
    if threads == 1:
        return [one(i) for i in range(len(imgs))]
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(len(imgs))))


MEAN = [0.406 * 255, 0.456 * 255, 0.485 * 255]
STD = [0.225 * 255, 0.224 * 255, 0.229 * 255]


def fused_rows(name, x, inv, B, OH, OW, bw, reps):
    """uint8 -> normalised float32 NCHW: one fused pass vs orbbec's warp then the torch ops."""
    mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1)
    std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1)

    def separate():
        return (warp_affine(x, inv, (OW, OH), inverse_map=True).float() - mean) / std

    def fused():
        return warp_affine(x, inv, (OW, OH), inverse_map=True, out_dtype=torch.float32, mean=MEAN, std=STD)

    x_hwc = x.contiguous(memory_format=torch.channels_last)  # as a decoder gives them

    def fused_from_hwc():
        return warp_affine(x_hwc, inv, (OW, OH), inverse_map=True, out_dtype=torch.float32, mean=MEAN, std=STD)

    nbytes = x.numel() + B * 3 * OH * OW * 4
    rows = []
    t_sep = cuda_time_ms(separate, reps)
    for label, fn in (("fused uint8 -> float32 NCHW", fused), ("fused uint8 NHWC -> float32 NCHW", fused_from_hwc),
                      ("warp + float() + normalise (separate)", separate)):
        ms = cuda_time_ms(fn, reps) if fn is not separate else t_sep
        rows.append((name, label, ms, B / (ms * 1e-3), 100 * nbytes / (ms * 1e-3) / 1e9 / bw, ms / t_sep))
    return rows


def varsize_rows(bw, reps, threads):
    """64 decoded images of mixed sizes -> 224 x 224: one launch vs per-image loops."""
    B, OH, OW = 64, 224, 224
    imgs = photos_bgr(B, None, shapes=VARSIZE_SHAPES)
    mats = forward_matrices(B, [s for s in VARSIZE_SHAPES], (OH, OW))
    dev = [torch.from_numpy(im).cuda() for im in imgs]
    M = torch.from_numpy(mats).cuda()
    inv = invert_affine(M)
    one = cuda_time_ms(lambda: warp_affine(dev, inv, (OW, OH), inverse_map=True), reps)
    loop = cuda_time_ms(lambda: [warp_affine(d.permute(2, 0, 1), inv[i], (OW, OH), inverse_map=True)
                                 for i, d in enumerate(dev)], reps)
    gs = cuda_time_ms(lambda: [grid_sample_warp(d.permute(2, 0, 1).unsqueeze(0), inv[i:i + 1], OH, OW)
                               for i, d in enumerate(dev)], reps)
    cvt = host_time_ms(lambda: cv2_batch(imgs, mats, OW, OH, threads), 3)
    nbytes = sum(im.size for im in imgs) + B * 3 * OH * OW
    return [("varsize", label, ms, B / (ms * 1e-3), 100 * nbytes / (ms * 1e-3) / 1e9 / bw, ms / one)
            for label, ms in (("orbbec list, one launch", one), ("orbbec per-image loop", loop),
                              ("affine_grid + grid_sample per-image loop", gs), (f"cv2 CPU {threads} threads", cvt))]


def batch_size_plot(path, reps):
    """images/s against batch size on the face workload, orbbec and the grid_sample path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [16, 64, 256, 1024, 4096]
    _, (H, W), (OH, OW) = WARP_WORKLOADS["face"]
    base = photos_bgr(4, (H, W))
    curves = {"orbbec NCHW": [], "orbbec NHWC": [], "affine_grid + grid_sample": []}
    for n in sizes:
        x = torch.from_numpy(np.stack([base[i % 4] for i in range(n)])).permute(0, 3, 1, 2).contiguous().cuda()
        xc = x.contiguous(memory_format=torch.channels_last)
        inv = invert_affine(torch.from_numpy(forward_matrices(n, (H, W), (OH, OW))).cuda())
        curves["orbbec NCHW"].append(n / cuda_time_ms(lambda: warp_affine(x, inv, (OW, OH), inverse_map=True), reps) * 1e3)
        curves["orbbec NHWC"].append(n / cuda_time_ms(lambda: warp_affine(xc, inv, (OW, OH), inverse_map=True), reps) * 1e3)
        curves["affine_grid + grid_sample"].append(n / cuda_time_ms(lambda: grid_sample_warp(x, inv, OH, OW), reps) * 1e3)
    plt.figure(figsize=(6, 4))
    for label, ys in curves.items():
        plt.loglog(sizes, ys, marker="o", label=label)
    plt.xlabel("batch size (250x250 -> 112x112 uint8)")
    plt.ylabel("images/s")
    plt.title(torch.cuda.get_device_name())
    plt.grid(True, which="both", alpha=0.3)
    plt.legend()
    plt.tight_layout()
    plt.savefig(path, dpi=100)


def peer_times(x, M, inv, imgs, mats, H, W, OH, OW, args) -> dict:
    """ms per batch of the peers on one workload: grid_sample, torchvision v2 and kornia where
    installed, cv2 on the CPU with all threads and with one."""
    res = {"grid_sample": cuda_time_ms(lambda: grid_sample_warp(x, inv, OH, OW), args.reps)}
    try:
        from torchvision.transforms.v2 import functional as TF

        angle, _ = 10.0, None
        res["tv2 affine (one param set)"] = cuda_time_ms(
            lambda: TF.affine(x, angle=angle, translate=[5, 5], scale=min(OH / H, OW / W), shear=[0.0]), args.reps)
    except ImportError:
        pass
    try:  # kornia, when installed (carried as a wheel to the GPU machine)
        import kornia

        Mf = M.float()
        res["kornia warp_affine (uint8 -> float -> uint8)"] = cuda_time_ms(
            lambda: kornia.geometry.transform.warp_affine(x.float(), Mf, (OH, OW), align_corners=True)
            .round_().clamp_(0, 255).to(torch.uint8), args.reps)
    except ImportError:
        pass
    res["cv2 CPU %d threads" % args.threads] = host_time_ms(lambda: cv2_batch(imgs, mats, OW, OH, args.threads), args.cpu_reps)
    res["cv2 CPU 1 thread"] = host_time_ms(lambda: cv2_batch(imgs, mats, OW, OH, 1), args.cpu_reps)
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="face,det,hd", help="comma-separated names (face, det, hd)")
    parser.add_argument("--reps", type=int, default=50, help="timed repetitions per GPU measurement")
    parser.add_argument("--cpu-reps", type=int, default=3, help="timed repetitions per CPU measurement")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for the cv2 peer")
    parser.add_argument("--out", default=None, help="write the markdown table here")
    parser.add_argument("--fused", action="store_true", help="also time the fused normalised output")
    parser.add_argument("--varsize", action="store_true", help="also time the variable-size list workload")
    parser.add_argument("--plot", default=None, help="save an images/s vs batch size plot here (PNG)")
    parser.add_argument("--quick", action="store_true",
                        help="orbbec's rows only (no peers): a minute, to compare builds of the kernels")
    args = parser.parse_args()
    # orbbec after the arguments: --help works where orbbec is not built
    global orbbec, invert_affine, warp_affine
    import orbbec
    from orbbec.warpaffine import invert_affine, warp_affine
    if not torch.cuda.is_available():
        sys.exit("benchmark_warpaffine: needs a CUDA device")
    import cv2

    try:
        from tqdm import tqdm
    except ImportError:  # progress bar is optional
        def tqdm(x, **_):
            return x

    bw = copy_bandwidth_gbs(args.reps)
    rows = []
    names = args.workloads.split(",")
    for name in tqdm(names, desc="workloads"):
        B, (H, W), (OH, OW) = WARP_WORKLOADS[name]
        imgs = photos_bgr(B, (H, W))
        mats = forward_matrices(B, (H, W), (OH, OW))
        x = torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).contiguous().cuda()
        x_cl = x.contiguous(memory_format=torch.channels_last)
        M = torch.from_numpy(mats).cuda()
        inv = invert_affine(M)
        nbytes = x.numel() + B * 3 * OH * OW
        # correctness while we are here: orbbec vs cv2 on this workload
        ours = warp_affine(x, M, (OW, OH)).permute(0, 2, 3, 1).cpu().numpy()
        ref = np.stack(cv2_batch(imgs, mats, OW, OH, args.threads))
        same = float((ours == ref).mean())
        res = {
            "orbbec NCHW": cuda_time_ms(lambda: warp_affine(x, inv, (OW, OH), inverse_map=True), args.reps),
            "orbbec NHWC": cuda_time_ms(lambda: warp_affine(x_cl, inv, (OW, OH), inverse_map=True), args.reps),
        }
        if not args.quick:
            res.update(peer_times(x, M, inv, imgs, mats, H, W, OH, OW, args))
        base = res["orbbec NCHW"]
        for peer, ms in res.items():
            rows.append((name, peer, ms, B / (ms * 1e-3), 100 * nbytes / (ms * 1e-3) / 1e9 / bw, ms / base))
        rows.append((name, "identical to cv2 (values)", same * 100, None, None, None))
        if args.fused:
            rows.extend(fused_rows(name, x, inv, B, OH, OW, bw, args.reps))
    if args.varsize:
        rows.extend(varsize_rows(bw, args.reps, args.threads))
    if args.plot:
        batch_size_plot(args.plot, args.reps)

    env = (f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
           f"cv2 {cv2.__version__}, orbbec built with CUDA {orbbec.get_compiling_cuda_version()}, "
           f"{os.cpu_count()} host cores ({platform.processor() or platform.machine()}); "
           f"device-to-device copy {bw:,.0f} GB/s")
    try:
        import torchvision
        env += f", torchvision {torchvision.__version__}"
    except ImportError:
        pass
    lines = [env, "", "| workload | implementation | ms per batch | images/s | % of copy bandwidth | time / orbbec NCHW |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for name, peer, ms, ips, pct, ratio in rows:
        if ips is None:
            lines.append(f"| {name} | {peer} | {ms:.4f} % | | | |")
        else:
            lines.append(f"| {name} | {peer} | {ms:.4f} | {ips:,.0f} | {pct:.1f} | {ratio:.2f}x |")
    emit_table("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
