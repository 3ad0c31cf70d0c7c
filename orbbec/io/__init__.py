"""orbbec.io: batched JPEG decoding, on the GPU with nvJPEG or on the CPU with OpenCV.

    from orbbec.io import decode_jpeg
    images = decode_jpeg(list_of_bytes, device="cuda")      # list of uint8 [H, W, 3] RGB tensors
    crops = warp_affine(images, M, (224, 224))              # straight into orbbec.warpaffine

On the GPU the hardware JPEG engine (A100, H100, ...) decodes what it takes; a batch of large images
leaves up to one image per host thread to nvJPEG's hybrid backend (Huffman decoding on CPU threads, the
rest on the GPU), decided by the batch alone so that the same batch always decodes to the same bits.
Files the hardware engine does not take (progressive, unusual sampling, CMYK) go to the hybrid path,
and files nvJPEG cannot decode at all to OpenCV on the CPU, automatically. See docs/io.md.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Optional, Sequence, Union

import torch

from .._library import _C
from ._buffers import JpegDecodeError, as_buffer, orient
from . import _cpu
from ..common import ArgumentError, ArgumentTypeError

__all__ = ["decode_jpeg", "start_decode", "read_file", "JpegDecodeError", "decoder_stats", "set_decode_threads",
           "configure_decoder", "TRAINING_DECODER"]

_MODES = {"RGB": 0, "BGR": 1, "GRAY": 2}

# This thread's last GPU decode: seconds inside the decoder (without the GIL) and of the whole native
# call (with taking the GIL back); GPULoader.timing() reports both.
last_call = threading.local()


def read_file(path: Union[str, os.PathLike]) -> bytes:
    """The bytes of a file, as a Dataset would hand them to decode_jpeg."""
    with open(path, "rb") as f:
        return f.read()


def decode_jpeg(
    data,
    *,
    device: Union[str, torch.device] = "cuda",
    mode: str = "RGB",
    on_error: str = "raise",
    reduce: Union[int, Sequence[int]] = 1,
    roi=None,
    apply_exif_orientation: bool = False,
    threads: Optional[int] = None,
):
    """Decodes one JPEG or a batch of them into uint8 HWC tensors.

    data: one encoded image or a list of them; each is bytes, a bytearray/memoryview, a 1-D uint8
        numpy array or a 1-D uint8 CPU tensor. A list in gives a list out (images differ in size).
    device: "cuda", "cuda:N" or a torch.device: decoded with nvJPEG on that GPU, on its current
        stream (the results are ordered on it like any op's output). "cpu": OpenCV (libjpeg-turbo) in
        `threads` parallel threads (default: all cores; 1 inside a DataLoader worker).
    mode: "RGB" or "BGR" ([H, W, 3]) or "GRAY" ([H, W, 1], the JPEG's luma).
    on_error: "raise" raises JpegDecodeError naming the first bad index (after every good image has
        been decoded); "skip" puts None in its place.
    reduce: 1, 2, 4 or 8, per batch or per image (CPU only): decode at 1/reduce of the size in the
        DCT domain, as cv2.IMREAD_REDUCED_* does (sizes round up).
    roi: None, or per image None or (x, y, width, height) in the stored image's pixels: only that
        region is decoded (on the GPU nvJPEG skips the rest where it can) and returned.
    apply_exif_orientation: rotate/flip by the EXIF orientation tag, as cv2.imread does by
        default. Off by default, as in torchvision.io.decode_jpeg: boxes and landmarks of datasets
        usually refer to the stored pixels. roi refers to the stored pixels either way.
    """
    single = not isinstance(data, (list, tuple))
    items = [data] if single else list(data)
    if mode not in _MODES:
        raise ArgumentError(f"decode_jpeg: mode must be one of {sorted(_MODES)}, got {mode!r}")
    if on_error not in ("raise", "skip"):
        raise ArgumentError(f"decode_jpeg: on_error must be 'raise' or 'skip', got {on_error!r}")
    buffers = [as_buffer(x, i, single) for i, x in enumerate(items)]
    rois = _per_image(roi, len(items), "roi", single, default=None)
    reduces = _per_image(reduce, len(items), "reduce", single, default=1)
    for i, r in enumerate(reduces):
        if r not in (1, 2, 4, 8):
            raise ArgumentError(f"decode_jpeg: reduce{'' if single else f'[{i}]'} must be 1, 2, 4 or 8, got {r!r}")
    dev = torch.device(device)
    if dev.type == "cpu":
        images, errors = _cpu.decode(buffers, mode, reduces, rois, apply_exif_orientation, threads)
    elif dev.type == "cuda":
        if any(r != 1 for r in reduces):
            raise ArgumentError("decode_jpeg: reduce is supported with device='cpu' only; on the GPU, decode "
                             "whole images (or a roi) and resize with orbbec.warpaffine")
        images, errors = _decode_cuda(buffers, mode, rois, apply_exif_orientation, dev)
    else:
        raise ArgumentError(f"decode_jpeg: device must be 'cpu' or a CUDA device, got {device!r}")
    bad = [i for i, e in enumerate(errors) if e]
    if bad and on_error == "raise":
        i = bad[0]
        more = f" ({len(bad) - 1} other images failed too)" if len(bad) > 1 else ""
        raise JpegDecodeError(f"decode_jpeg: {'data' if single else f'data[{i}]'}: {errors[i]}{more}", i)
    return images[0] if single else images


def _per_image(value, n, name, single, default):
    """One entry per image: a scalar (or, for one image, its roi) applies to all."""
    if value is None:
        return [default] * n
    if isinstance(value, int) or (single and name == "roi"):
        return [value] * n
    value = list(value)
    if len(value) != n:
        raise ArgumentError(f"decode_jpeg: {name} must give one entry per image ({n}), got {len(value)}")
    return [default if v is None else v for v in value]


# Whether this process has called into the GPU decoder: its settings are read when it is created.
_decoder_created = False


def _nvjpeg_device_index(dev, caller="decode_jpeg"):
    """The CUDA device index the GPU decoder runs on for `dev` (whose decoder the caller is about to
    create or use); refuses a build without nvJPEG."""
    global _decoder_created
    if not getattr(_C, "with_nvjpeg", False):
        raise RuntimeError(f"{caller}: orbbec was built without nvJPEG, so it cannot decode on the GPU; "
                           "rebuild with CUDA and nvJPEG (`pip install nvidia-nvjpeg`, see docs/building.md) "
                           "or use device='cpu'")
    _decoder_created = True
    return dev.index if dev.index is not None else torch.cuda.current_device()


def _decode_cuda(buffers, mode, rois, apply_exif, dev, only_path=-1):
    index = _nvjpeg_device_index(dev)
    roi_arg = None if all(r is None for r in rois) else rois
    t0 = time.perf_counter()
    raw = _C.decode_jpeg_cuda(buffers, _MODES[mode], index, roi_arg, only_path)
    last_call.native_s, last_call.call_s = raw[5], time.perf_counter() - t0
    return _finish_cuda(raw, buffers, mode, rois, apply_exif, index)


def _finish_cuda(raw, buffers, mode, rois, apply_exif, index):
    images, errors, unsupported, orientations = raw[:4]
    # What nvJPEG cannot decode at all (e.g. 12-bit or lossless JPEG) goes to OpenCV, then to the GPU.
    retry = [i for i, u in enumerate(unsupported) if u]
    if retry:
        cpu_images, cpu_errors = _cpu.decode([buffers[i] for i in retry], mode, [1] * len(retry),
                                             [rois[i] for i in retry], False, None)
        for i, img, err in zip(retry, cpu_images, cpu_errors):
            images[i] = None if img is None else img.to(f"cuda:{index}", non_blocking=False)
            errors[i] = err
            orientations[i] = _cpu.exif_orientation(buffers[i]) if img is not None else 1
    if apply_exif:
        images = [orient(img, o) if img is not None else None for img, o in zip(images, orientations)]
    return images, errors


class StartedDecode:
    """A GPU decode under way (start_decode): the decoder works on it in a native thread while the
    caller's Python goes on. result() waits for it (without the GIL) and returns decode_jpeg's list
    with on_error="skip" (None where an image failed) and the error messages.

    With `warp` (orbbec.warpaffine.list_warp_args's tuple) the decoder's thread also warps the batch
    once every image has decoded: then `warped` holds the [B, C, H, W] result and result()'s images
    are None (errors all ''); if any image failed, `warped` stays None and the images come back."""

    def __init__(self, data, mode, device, images=None, errors=None, warp=None):
        self._data, self._mode = data, mode
        self._done = None if images is None else (images, errors)
        self.warped = None
        if self._done is None:
            self._index = _nvjpeg_device_index(device)
            if isinstance(data, PackedImages):
                self._pending = _C.decode_jpeg_cuda_start_packed(data.flat, data.offsets, _MODES[mode], self._index,
                                                                 warp=warp)
            else:
                self._pending = _C.decode_jpeg_cuda_start(data, _MODES[mode], self._index, None, warp=warp)

    def result(self):
        if self._done is None:
            raw = self._pending.wait()
            self._pending = None
            # The decoder's own host time, and how long taking the GIL back took once it was done.
            last_call.native_s, last_call.gil_s = raw[5], raw[6]
            self.warped = raw[7]
            if self.warped is not None:
                self._done = raw[0], raw[1]
            else:
                self._done = _finish_cuda(list(raw[:6]), self._data, self._mode, [None] * len(self._data), False,
                                          self._index)
        return self._done


class PackedImages:
    """Encoded images packed in one 1-D uint8 buffer (a numpy array): image i is
    flat[offsets[i]:offsets[i + 1]]. The GPU decoder takes the buffer whole; views are made only
    when asked for (an image the decoder hands to OpenCV)."""

    def __init__(self, flat, offsets):
        self.flat, self.offsets = flat, offsets

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        return self.flat[self.offsets[i]:self.offsets[i + 1]]


def start_decode(data, *, device="cuda", mode: str = "RGB") -> StartedDecode:
    """Starts decoding a batch (a list, as decode_jpeg takes) and returns at once on the GPU: batches
    started one after another reach the decoder, and the current stream, in that order, so a loader
    can prepare the next batch while the decoder works. On the CPU it decodes before returning."""
    if not isinstance(data, (list, tuple)):
        raise ArgumentTypeError(f"start_decode: data must be a list of encoded images (one batch), got "
                                f"{type(data).__name__}; decode_jpeg takes a single image")
    return start_batch_decode(data, device=device, mode=mode)


def start_batch_decode(data, warp=None, *, device="cuda", mode: str = "RGB") -> StartedDecode:
    """start_decode for orbbec.data's loader: `data` is a list or a PackedImages batch (which the GPU
    decoder takes whole); with `warp` (orbbec.warpaffine.list_warp_args's tuple) the decoder's thread
    also warps the batch on the GPU (see StartedDecode; on the CPU it only decodes)."""
    if mode not in _MODES:
        raise ArgumentError(f"start_decode: mode must be one of {sorted(_MODES)}, got {mode!r}")
    if not isinstance(data, PackedImages):
        data = [as_buffer(x, i, False) for i, x in enumerate(data)]
    dev = torch.device(device)
    if dev.type == "cuda":
        return StartedDecode(data, mode, dev, warp=warp)
    buffers = [data[i] for i in range(len(data))]
    images, errors = _cpu.decode(buffers, mode, [1] * len(buffers), [None] * len(buffers), False, None)
    return StartedDecode(buffers, mode, dev, images, errors)


def decoder_stats(device: Union[str, torch.device, int] = "cuda") -> dict:
    """Images decoded by each GPU path so far and the rates that divide the next batch."""
    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    index = _nvjpeg_device_index(dev, "decoder_stats")  # (reading the stats creates the decoder)
    return dict(_C.jpeg_decoder_stats(index))


# The decoder setting beside a training step (configure_decoder(**TRAINING_DECODER)): the hybrid path on
# a few host threads keeps the step within 5% of its speed on synthetic data, where the engine's and
# the whole pool's work cost it 5-11% (docs/benchmark_pipeline.md, "A training loop fed by the loader").
TRAINING_DECODER = {"hardware_engine": False, "threads": 6}


def configure_decoder(*, hardware_engine: bool = True, threads: Optional[int] = None) -> None:
    """How this process's GPU decoder works; call it before the process's first GPU decode.

    hardware_engine=False leaves the hardware JPEG engine alone: everything takes the hybrid path
    (Huffman decoding on `threads` host threads, the rest on the GPU). Beside a training step that
    needs far fewer images per second than the engine gives, `configure_decoder(hardware_engine=False,
    threads=6)` (TRAINING_DECODER) keeps the step's own speed (docs/data.md, "Beside a training step");
    the default is tuned for throughput. The same as ORBBEC_NVJPEG_HARDWARE=0 and ORBBEC_DECODE_THREADS=6 in the
    environment."""
    if not isinstance(hardware_engine, bool):
        raise ArgumentTypeError(f"configure_decoder: hardware_engine must be a bool, got {type(hardware_engine).__name__}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)):
        raise ArgumentTypeError(f"configure_decoder: threads must be an int or None, got {type(threads).__name__}")
    if threads is not None and threads < 1:
        raise ArgumentError(f"configure_decoder: threads must be at least 1, got {threads}")
    if _decoder_created:
        raise RuntimeError("configure_decoder: this process's GPU decoder already exists (a GPU decode or "
                           "decoder_stats has run), and its settings are read when it is created; call "
                           "configure_decoder first, or set ORBBEC_NVJPEG_HARDWARE / ORBBEC_DECODE_THREADS "
                           "in the environment")
    # The native decoder reads the variable when it is created (putenv reaches its getenv).
    os.environ["ORBBEC_NVJPEG_HARDWARE"] = "1" if hardware_engine else "0"
    if threads is not None:
        set_decode_threads(threads)


def set_decode_threads(threads: int) -> None:
    """Host threads of the GPU decoder's hybrid path, for decoders created after this call
    (default: one less than the cores, between 2 and 16)."""
    if getattr(_C, "with_nvjpeg", False):
        _C.set_jpeg_decode_threads(int(threads))
