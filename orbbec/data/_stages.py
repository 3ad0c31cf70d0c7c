"""The GPU side's stages of a batch, shared by the CPU path (in the workers) and the GPU path (the
loader's background threads): decode the encoded images, keep the samples that decoded, warp them."""
from __future__ import annotations

import time

from ..io import JpegDecodeError, PackedImages, start_batch_decode
from ..io import last_call as io_last_call
from ._samples import HostBatch, select_rows


def assemble(cfg, batch: HostBatch) -> None:
    """Decodes and augments a batch on cfg.device (in the current stream)."""
    decode_batch(cfg, batch)
    augment_batch(cfg, batch)


def decode_batch(cfg, batch: HostBatch) -> None:
    """Decodes the batch's images (in the current stream); leaves in batch.extra the images and the
    rows (samples) kept, and raises for a bad sample when on_error="raise"."""
    finish_decode(cfg, batch, start_decode_batch(cfg, batch))


def start_decode_batch(cfg, batch: HostBatch):
    """Starts decoding the batch's encoded images (on the GPU the decoder works on them while the
    caller goes on; on the CPU they are decoded now); None when there are none."""
    t0 = time.perf_counter()
    if batch.packed is not None and all(batch.encoded):
        # Every sample's bytes in the workers' packed buffer: the GPU decoder takes the buffer whole.
        pos = list(range(len(batch.indices)))
        data = PackedImages(batch.packed.numpy(), batch.offsets)
    else:
        encoded = batch.buffers()
        pos = [i for i, e in enumerate(encoded) if e is not None]
        data = [encoded[i] for i in pos]
    batch.extra["encoded_rows"] = pos
    started = None
    if pos:
        started = start_batch_decode(data, _warp_in_decoder(cfg, batch, pos), device=cfg.device, mode=cfg.mode)
    batch.extra["start_s"] = time.perf_counter() - t0
    return started


def _warp_in_decoder(cfg, batch: HostBatch, pos):
    """The warp's arguments for the GPU decoder's thread (list_warp_args), when every sample of the
    batch is to be decoded there; else None (the augmenting thread warps what decoded)."""
    if (cfg.device.type != "cuda" or not hasattr(cfg.transform, "warp_options") or batch.params is None
            or len(pos) != len(batch.indices)):
        return None
    from ..warpaffine import list_warp_args

    p = batch.params
    channels = 1 if cfg.mode == "GRAY" else 3
    return list_warp_args(p.matrices, (p.size[1], p.size[0]), channels, border_value=cfg.border_value,
                          **cfg.transform.warp_options())


def finish_decode(cfg, batch: HostBatch, started) -> None:
    """Takes the result of start_decode_batch (see decode_batch)."""
    t0 = time.perf_counter()
    try:
        _take_decoded(cfg, batch, started)
    finally:
        batch.extra["decode_s"] = batch.extra.pop("start_s", 0.0) + time.perf_counter() - t0


def _take_decoded(cfg, batch: HostBatch, started) -> None:
    pos = batch.extra.pop("encoded_rows")
    images = list(batch.decoded)
    if pos:
        decoded, reasons = started.result()
        if cfg.device.type == "cuda":
            batch.extra["native_s"] = getattr(io_last_call, "native_s", 0.0)
            batch.extra["gil_s"] = getattr(io_last_call, "gil_s", 0.0)
        if started.warped is not None:  # every sample decoded and was warped in the decoder's thread
            batch.extra["rows"], batch.extra["bad"], batch.extra["images"] = list(range(len(images))), [], None
            batch.extra["warped"] = started.warped
            return
        for i, img, reason in zip(pos, decoded, reasons):
            images[i] = img
            if img is None and not batch.errors[i]:
                batch.errors[i] = reason or "could not be decoded"
    rows = [i for i, img in enumerate(images) if img is not None and not batch.errors[i]]
    kept = set(rows)
    bad = [i for i in range(len(images)) if i not in kept]
    if bad and cfg.on_error == "raise":
        i = bad[0]
        raise JpegDecodeError(f"GPULoader: sample {batch.indices[i]} (position {i} of its batch): "
                              f"{batch.errors[i] or 'could not be decoded'}", batch.indices[i])
    batch.extra["rows"], batch.extra["bad"] = rows, [batch.indices[i] for i in bad]
    # The decoder's images are on cfg.device already; only images the dataset gave decoded may move.
    for i, given in enumerate(batch.decoded):
        if given is not None and images[i] is not None and images[i].device != cfg.device:
            images[i] = images[i].to(cfg.device, non_blocking=True)
    batch.extra["images"] = [images[i] for i in rows]


def augment_batch(cfg, batch: HostBatch) -> None:
    """Warps (and normalises) the decoded images of decode_batch into batch.images; the targets keep
    the rows kept."""
    rows, images = batch.extra["rows"], batch.extra.pop("images")
    warped = batch.extra.pop("warped", None)
    if warped is not None:
        batch.images = cfg.transform.after_warp(warped, batch.params)
    elif not rows:
        batch.images = None
    elif cfg.transform is None:
        batch.images = images
    else:
        from ..augment import Params
        p = batch.params
        params = Params(p.matrices[rows] if len(rows) < len(p.samples) else p.matrices, p.size,
                        [p.samples[i] for i in rows])
        batch.params = params
        batch.images = cfg.transform.apply(images, params, border_value=cfg.border_value)
    if len(rows) < len(batch.indices):
        batch.targets = select_rows(batch, rows)
