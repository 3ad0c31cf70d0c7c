"""orbbec.io.decode_jpeg: the CPU path against cv2.imdecode (identical), the GPU path against cv2
within the decoders' IDCT and upsampling differences, bad input, sizes, memory and streams."""
import ast
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import HAS_CUDA, requires_cuda, subprocess_env
from jpeg_files import broken, cv2_decode, encode, photo, variants, with_exif_orientation, with_frame_size

import orbbec.io as oio
from orbbec.io import JpegDecodeError, decode_jpeg

HAS_NVJPEG = HAS_CUDA and oio._C.with_nvjpeg
requires_nvjpeg = pytest.mark.skipif(not HAS_NVJPEG, reason="CUDA test: no CUDA device (or orbbec built without nvJPEG)")

# GPU against cv2 (libjpeg-turbo): nvJPEG's IDCT and chroma upsampling differ from libjpeg-turbo's
# integer IDCT and 'fancy' upsampling, so pixels differ by a few levels, most at sharp colour edges.
# Bounds from the differences measured on the H100 (docs/io.md), with margin.
# Small images have relatively more pixels at colour edges, where the chroma upsampling differs.
GPU_MEAN_BOUND = 1.5
GPU_MEAN_BOUND_SMALL = 4.0  # images under 200 x 200
GPU_P999_BOUND = 24


def _diff(a: torch.Tensor, b: np.ndarray):
    d = np.abs(a.cpu().numpy().astype(np.int16) - b.astype(np.int16))
    return float(d.mean()), float(np.quantile(d, 0.999)), int(d.max())


def _close(a: torch.Tensor, b: np.ndarray) -> bool:
    bound = GPU_MEAN_BOUND if b.shape[0] * b.shape[1] >= 200 * 200 else GPU_MEAN_BOUND_SMALL
    return a.device.type == "cuda" and a.shape == b.shape and _diff(a, b)[0] < bound


# ---------------------------------------------------------------- CPU path (runs in CI)

@pytest.mark.parametrize("mode", ["RGB", "BGR", "GRAY"])
def test_cpu_equals_cv2_on_every_kind_of_file(mode):
    files = variants()
    out = decode_jpeg(list(files.values()), device="cpu", mode=mode)
    for (name, jpeg), img in zip(files.items(), out):
        ref = cv2_decode(jpeg, mode)
        assert img.dtype == torch.uint8 and img.shape == ref.shape, name
        assert torch.equal(img, torch.from_numpy(ref)), name


@pytest.mark.parametrize("reduce", [2, 4, 8])
def test_cpu_reduce_equals_cv2_reduced(reduce):
    files = list(variants().values())
    out = decode_jpeg(files, device="cpu", reduce=reduce)
    for jpeg, img in zip(files, out):
        assert torch.equal(img, torch.from_numpy(cv2_decode(jpeg, reduce=reduce)))


def test_cpu_reduce_per_image():
    files = list(variants().values())[:4]
    reduces = [1, 2, 4, 8]
    out = decode_jpeg(files, device="cpu", reduce=reduces)
    for jpeg, r, img in zip(files, reduces, out):
        assert torch.equal(img, torch.from_numpy(cv2_decode(jpeg, reduce=r)))


def test_accepts_bytes_numpy_tensor_and_one_image():
    jpeg = encode(photo(0, (64, 80)))
    ref = torch.from_numpy(cv2_decode(jpeg))
    for form in (jpeg, bytearray(jpeg), memoryview(jpeg), np.frombuffer(jpeg, np.uint8),
                 torch.frombuffer(bytearray(jpeg), dtype=torch.uint8)):
        assert torch.equal(decode_jpeg(form, device="cpu"), ref)
    with pytest.raises(TypeError, match="path"):
        decode_jpeg("image.jpg", device="cpu")
    with pytest.raises(ValueError, match=r"data\[1\].*1-D uint8"):
        decode_jpeg([jpeg, np.zeros((2, 2), np.uint8)], device="cpu")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_nvjpeg)])
def test_bad_buffers_name_their_index_and_lose_no_good_image(device):
    good = [encode(photo(i, (96 + 8 * i, 128))) for i in range(3)]
    bad = broken(good[0])
    expected = {"corrupt": "", "truncated": "truncated", "empty": "empty", "png": "PNG",
                "huge-header": "claims 65500 x 65500 pixels, more than a file of"}
    for name, buf in bad.items():
        batch = [good[0], good[1], buf, good[2]]
        with pytest.raises(JpegDecodeError, match=r"data\[2\]: .*" + expected[name]) as err:
            decode_jpeg(batch, device=device)
        assert err.value.index == 2
        assert isinstance(err.value, ValueError) and isinstance(err.value, RuntimeError)
        out = decode_jpeg(batch, device=device, on_error="skip")
        assert out[2] is None
        for k, j in zip((0, 1, 3), good):
            ref = cv2_decode(j)
            if device == "cpu":
                assert torch.equal(out[k], torch.from_numpy(ref))
            else:
                assert _close(out[k], ref)


def test_the_most_compressible_jpegs_are_not_taken_for_forged_sizes():
    """The size check (a Huffman-coded block takes at least one bit) passes the smallest real files:
    uniform grey and colour images, optimised and progressive, which reach 2 bits per block."""
    import cv2

    from orbbec._library import _C

    for shape in [(6000, 8000, 1), (3000, 4000, 3), (9, 7, 3)]:
        img = np.full(shape, 97, np.uint8)
        for extra in ([], [cv2.IMWRITE_JPEG_OPTIMIZE, 1], [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]):
            ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 10] + extra)
            assert ok and _C.jpeg_buffer_problem(buf) == "", (shape, extra, len(buf))
    # the last (9 x 7) file's header claiming 4096 x 4096 is refused
    assert "claims 4096 x 4096 pixels" in _C.jpeg_buffer_problem(
        np.frombuffer(with_frame_size(buf.tobytes(), 4096, 4096), np.uint8))
    assert decode_jpeg(buf.tobytes(), device="cpu").shape == (9, 7, 3)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_nvjpeg)])
def test_cmyk_jpeg_decodes_to_its_colours(device):
    """A CMYK JPEG (Adobe's inverted CMYK, as Photoshop writes it; ImageNet has a few) comes out
    in RGB with the colours Pillow gives it, not inverted and not as four channels; GRAY too."""
    import io

    from PIL import Image

    rgb = np.ascontiguousarray(photo(1, (120, 160))[:, :, ::-1])
    buf = io.BytesIO()
    Image.fromarray(rgb).convert("CMYK").save(buf, "JPEG", quality=95)
    data = buf.getvalue()
    pil = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(np.int16)
    assert np.abs(pil - rgb).mean() < 2  # the file holds the photograph
    out = decode_jpeg([data, encode(photo(0, (64, 80)))], device=device)[0].cpu().numpy().astype(np.int16)
    assert out.shape == (120, 160, 3)
    diff = np.abs(out - pil)
    assert diff.mean() < 2 and (diff.max() <= 1 if device == "cpu" else np.percentile(diff, 99) <= 8), diff.mean()
    grey = decode_jpeg(data, device=device, mode="GRAY").cpu().numpy()
    assert grey.shape == (120, 160, 1) and abs(float(grey.mean()) - float(np.asarray(
        Image.open(io.BytesIO(data)).convert("L")).mean())) < 3


def test_cpu_one_pixel_and_a_batch_of_512():
    one = encode(np.full((1, 1, 3), (10, 200, 90), np.uint8), sampling="444")
    img = decode_jpeg(one, device="cpu")
    assert img.shape == (1, 1, 3) and torch.equal(img, torch.from_numpy(cv2_decode(one)))
    files = [encode(photo(i, (24 + i % 7, 32 + i % 5))) for i in range(512)]
    out = decode_jpeg(files, device="cpu")
    assert len(out) == 512
    for j in (0, 137, 511):
        assert torch.equal(out[j], torch.from_numpy(cv2_decode(files[j])))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_cpu_exif_orientation(orientation):
    jpeg = with_exif_orientation(encode(photo(0, (48, 80))), orientation)
    assert oio._cpu.exif_orientation(jpeg) == orientation
    stored = decode_jpeg(jpeg, device="cpu")
    assert torch.equal(stored, torch.from_numpy(cv2_decode(jpeg, exif=False)))
    shown = decode_jpeg(jpeg, device="cpu", apply_exif_orientation=True)
    assert torch.equal(shown, torch.from_numpy(cv2_decode(jpeg, exif=True)))
    # orbbec.io's own orientation (used on the GPU) agrees with cv2's
    assert torch.equal(oio._buffers.orient(stored, orientation), shown)


def test_cpu_roi_is_the_crop():
    jpeg = encode(photo(1, (200, 300)))
    full = decode_jpeg(jpeg, device="cpu")
    crop = decode_jpeg(jpeg, device="cpu", roi=(37, 21, 100, 64))
    assert torch.equal(crop, full[21:85, 37:137])
    with pytest.raises(JpegDecodeError, match="roi"):
        decode_jpeg(jpeg, device="cpu", roi=(250, 0, 100, 10))


def test_argument_errors():
    jpeg = encode(photo(0, (32, 32)))
    with pytest.raises(ValueError, match="mode"):
        decode_jpeg(jpeg, device="cpu", mode="RGBA")
    with pytest.raises(ValueError, match="reduce"):
        decode_jpeg(jpeg, device="cpu", reduce=3)
    with pytest.raises(ValueError, match="on_error"):
        decode_jpeg(jpeg, device="cpu", on_error="ignore")
    with pytest.raises(ValueError, match="one entry per image"):
        decode_jpeg([jpeg, jpeg], device="cpu", reduce=[1])


def test_cpu_large_image():
    big = np.tile(photo(3, (1000, 1000)), (8, 8, 1))  # 8000 x 8000
    jpeg = encode(big, quality=75)
    img = decode_jpeg(jpeg, device="cpu")
    assert img.shape == (8000, 8000, 3) and torch.equal(img, torch.from_numpy(cv2_decode(jpeg)))


# Rows of one MCU row by chroma sampling (the largest vertical factor, times 8).
MCU_HEIGHT = {"sampling-444": 8, "sampling-422": 8, "sampling-420": 16, "sampling-440": 16, "sampling-411": 8,
              "gray": 8, "progressive": 16, "restart": 16, "optimized": 16, "odd-size": 16}


def test_frame_header_is_read_from_every_kind_of_file_and_no_damage_breaks_it():
    """jpeg_frame (read natively) gives each file's size as OpenCV decodes it, the frame header's
    offset, its MCU height by sampling, and rows cuttable only for one-scan sequential files; every
    prefix of a header and every corrupted header byte gives None or a frame inside the buffer."""
    from orbbec.io._buffers import jpeg_frame

    rng = np.random.default_rng(5)
    for name, jpeg in variants((200, 280)).items():
        f = jpeg_frame(jpeg)
        assert (f.height, f.width) == cv2_decode(jpeg).shape[:2], name
        assert jpeg[f.offset] == 0xFF and jpeg[f.offset + 1] in (0xC0, 0xC1, 0xC2), name
        assert f.mcu_height == MCU_HEIGHT[name] and f.rows_cuttable == (name != "progressive"), name
        assert jpeg_frame(np.frombuffer(jpeg, np.uint8)) == f and jpeg_frame(bytearray(jpeg)) == f
        scan = jpeg.index(b"\xff\xda")
        for n in range(scan + 6):  # cut anywhere in the header: no frame, or one the prefix holds
            g = jpeg_frame(jpeg[:n])
            assert g is None or (g[:4] == f[:4] and g.offset + 10 <= n), (name, n)
        for _ in range(300):
            bad = bytearray(jpeg)
            bad[rng.integers(2, scan + 6)] = rng.integers(0, 256)
            g = jpeg_frame(bytes(bad))
            assert g is None or (g.offset + 10 <= len(bad) and g.mcu_height in (8, 16, 24, 32, 40, 48, 56, 64, 72,
                                                                                 80, 88, 96, 104, 112, 120))
    assert jpeg_frame(b"") is None and jpeg_frame(b"\xff\xd8\xff\xd9") is None


def _cut_short(jpeg: bytes, rows: int) -> np.ndarray:
    from orbbec.io._buffers import jpeg_frame, with_height
    cut = np.frombuffer(jpeg, np.uint8).copy()
    with_height(cut, jpeg_frame(jpeg), rows)
    return cut


def _cuttable_variants():
    """name -> (JPEG, its frame header) for the files whose rows can be cut short; the progressive
    one must not be (its scans each cover the whole image)."""
    from orbbec.io._buffers import jpeg_frame
    frames = {name: (jpeg, jpeg_frame(jpeg)) for name, jpeg in variants((200, 280)).items()}
    assert not frames["progressive"][1].rows_cuttable and frames["sampling-420"][1].rows_cuttable
    assert frames["sampling-420"][1].mcu_height == 16 and frames["sampling-444"][1].mcu_height == 8
    return {name: f for name, f in frames.items() if f[1].rows_cuttable}


# A decoder's last row of a 2x vertically subsampled image is upsampled from its own chroma row only:
# the rows of a cut frame are the whole image's but for the last (orbbec/data/_rows.py keeps 2 more).
CUT_ROWS_THAT_MAY_DIFFER = 2


def test_cpu_a_frame_cut_short_decodes_to_the_whole_images_top_rows():
    for name, (jpeg, frame) in _cuttable_variants().items():
        full = cv2_decode(jpeg)
        for rows in range(frame.mcu_height, frame.height, 3 * frame.mcu_height):
            img = decode_jpeg(_cut_short(jpeg, rows), device="cpu")
            keep = rows - CUT_ROWS_THAT_MAY_DIFFER
            assert img.shape == (rows,) + full.shape[1:], (name, rows)
            assert torch.equal(img[:keep], torch.from_numpy(full[:keep])), (name, rows)
    with pytest.raises(ValueError, match="cannot cut"):
        _cut_short(encode(photo(0, (64, 64))), 40)  # not a multiple of the MCU height


# ---------------------------------------------------------------- GPU path

@requires_nvjpeg
@pytest.mark.parametrize("path", [-1, 0, 1])
@pytest.mark.parametrize("mode", ["RGB", "BGR", "GRAY"])
def test_gpu_close_to_cv2_on_every_kind_of_file(mode, path):
    files = variants()
    imgs, errors = oio._decode_cuda([oio.as_buffer(f, 0, True) for f in files.values()], mode,
                                    [None] * len(files), False, torch.device("cuda"), only_path=path)
    assert errors == [""] * len(files)
    for (name, jpeg), img in zip(files.items(), imgs):
        ref = cv2_decode(jpeg, mode)
        assert img.device.type == "cuda" and img.shape == ref.shape, name
        mean, p999, _ = _diff(img, ref)
        assert mean < GPU_MEAN_BOUND and p999 <= GPU_P999_BOUND, (name, mean, p999)


@requires_nvjpeg
@pytest.mark.parametrize("path", [0, 1])
def test_gpu_a_frame_cut_short_decodes_to_the_whole_images_top_rows(path):
    """The loader's partial decode: each path, told by the frame header that the image ends early,
    decodes its first rows as it decodes them in the whole image, and reports no error for the
    coded data it leaves unread."""
    names, cut, full, rows_of = [], [], [], []
    for name, (jpeg, frame) in _cuttable_variants().items():
        for rows in range(frame.mcu_height, frame.height, 5 * frame.mcu_height):
            names.append(name)
            cut.append(_cut_short(jpeg, rows))
            full.append(np.frombuffer(jpeg, np.uint8))
            rows_of.append(rows)
    dev = torch.device("cuda")
    cut_imgs, errors = oio._decode_cuda(cut, "RGB", [None] * len(cut), False, dev, only_path=path)[:2]
    whole = oio._decode_cuda(full, "RGB", [None] * len(full), False, dev, only_path=path)[0]
    assert errors == [""] * len(cut)
    for name, rows, a, b in zip(names, rows_of, cut_imgs, whole):
        keep = rows - CUT_ROWS_THAT_MAY_DIFFER
        assert a.shape == (rows,) + b.shape[1:], (name, rows)
        assert torch.equal(a[:keep], b[:keep]), (name, rows)


@requires_nvjpeg
def test_gpu_both_paths_are_used_and_agree():
    files = [encode(photo(i, (360, 480))) for i in range(64)]
    before = oio.decoder_stats()
    hw = oio._decode_cuda(files, "RGB", [None] * 64, False, torch.device("cuda"), only_path=0)[0]
    hy = oio._decode_cuda(files, "RGB", [None] * 64, False, torch.device("cuda"), only_path=1)[0]
    for _ in range(5):
        auto = decode_jpeg(files)
    after = oio.decoder_stats()
    assert after["hybrid_images"] - before["hybrid_images"] >= 64
    if after["hardware_available"]:
        assert after["hardware_images"] - before["hardware_images"] >= 64
    # The host-time phases count these 7 calls; the hybrid-only call spent host time on hybrid images.
    h0, h1 = before["host_seconds"], after["host_seconds"]
    assert h1["calls"] - h0["calls"] == 7
    assert all(h1[k] >= h0[k] for k in h1) and h1["hybrid"] > h0["hybrid"] and h1["parse"] > h0["parse"]
    if after["hardware_available"]:
        assert h1["lane_submit"] > h0["lane_submit"]
    for a, b, c, j in zip(hw, hy, auto, files):
        ref = cv2_decode(j)
        for img in (a, b, c):
            assert _close(img, ref)


@requires_nvjpeg
def test_gpu_decoder_allocates_nothing_in_the_steady_state():
    # Batches of one size whose images vary in size, as the loader's cut images do: once the first
    # batches have sized nvJPEG's buffers, no batch makes nvJPEG free or allocate memory (cudaFree
    # waits for the whole device, a training step included) or re-initialise a hardware lane.
    rng = np.random.default_rng(5)
    batches = [[encode(photo(int(rng.integers(1 << 20)), (int(rng.integers(200, 480)), int(rng.integers(200, 640)))))
                for _ in range(48)] for _ in range(3)]
    for _ in range(2):
        for b in batches:
            decode_jpeg(b)
    torch.cuda.synchronize()
    before = oio.decoder_stats()["memory_calls"]
    for _ in range(3):
        for b in batches:
            decode_jpeg(b)
    torch.cuda.synchronize()
    after = oio.decoder_stats()["memory_calls"]
    assert set(after) == {"device_allocs", "device_frees", "pinned_allocs", "pinned_frees", "lane_initializations"}
    assert after == before, (before, after)


@requires_nvjpeg
def test_gpu_same_batch_same_bits_when_shared_between_paths():
    # Batches of large images leave a share to the hybrid path; which images take it depends on the
    # batch alone, so decoding the same batch gives the same bits every time, whatever ran between.
    distinct = [encode(photo(i, (720, 1440))) for i in range(8)]
    files = [distinct[(i * 5) % 8] for i in range(48)]
    small = [encode(photo(i, (120, 160))) for i in range(40)]
    before = oio.decoder_stats()
    first = decode_jpeg(files)
    decode_jpeg(small)
    decode_jpeg(files[:7])
    again = decode_jpeg(files)
    after = oio.decoder_stats()
    for i, (a, b) in enumerate(zip(first, again)):
        assert torch.equal(a, b), i
        assert _close(a, cv2_decode(files[i]))
    if after["hardware_available"]:
        assert after["hybrid_images"] - before["hybrid_images"] >= 2, (before, after)
        assert after["hardware_images"] - before["hardware_images"] >= 2 * 48 - 2 * 13, (before, after)


@requires_nvjpeg
def test_gpu_started_batches_of_large_images_share_more_and_keep_their_bits():
    # start_decode begins the next batch while one finishes, so the hybrid threads go on to the next
    # batch's images and take a larger share of large ones than a single call does; the share is
    # still decided by the batch alone, so a batch decodes to the same bits every time.
    distinct = [encode(photo(i, (1080, 1920))) for i in range(8)]
    files = [distinct[(i * 3) % 8] for i in range(64)]
    s0 = oio.decoder_stats()
    single = decode_jpeg(files)
    s1 = oio.decoder_stats()
    started = [oio.start_decode(files) for _ in range(3)]
    results = [s.result()[0] for s in started]
    s2 = oio.decoder_stats()
    for again in results[1:]:
        for i, (a, b) in enumerate(zip(results[0], again)):
            assert torch.equal(a, b), i
    for i, (a, b) in enumerate(zip(results[0], single)):
        ref = cv2_decode(files[i])
        assert _close(a, ref) and _close(b, ref), i
    if s0["hardware_available"] and os.environ.get("ORBBEC_NVJPEG_OVERLAP", "1") != "0":
        single_share = s1["hybrid_images"] - s0["hybrid_images"]
        started_share = (s2["hybrid_images"] - s1["hybrid_images"]) / 3
        assert started_share == int(started_share) and started_share > single_share > 0, (single_share, started_share)


_SHARE_PROBE = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from jpeg_files import encode, photo
import orbbec.io as oio
files = [encode(photo(i, (720, 1440))) for i in range(4)] * 12
for _ in range(2):
    out = oio.decode_jpeg(files)
torch.cuda.synchronize()
s = oio.decoder_stats()
print(s["hybrid_images"], s["hardware_images"], s["hardware_available"])
"""


@requires_nvjpeg
@pytest.mark.parametrize("share", ["0", "1"])
def test_gpu_share_setting(share):
    # ORBBEC_NVJPEG_SHARE=0 keeps every image the engine takes on the engine; the default shares
    # large batches. The setting is read when a process's decoder is made: a fresh process each.
    env = dict(os.environ, ORBBEC_NVJPEG_SHARE=share)
    run = subprocess.run([sys.executable, "-c", _SHARE_PROBE, os.path.dirname(os.path.abspath(__file__))],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    hybrid, hardware, available = run.stdout.split()[-3:]
    if available != "True":
        pytest.skip("no hardware JPEG engine on this GPU: everything takes the hybrid path")
    if share == "0":
        assert (int(hybrid), int(hardware)) == (0, 96)
    else:
        assert int(hybrid) > 0 and int(hybrid) + int(hardware) == 96


def test_configure_decoder_checks_its_arguments_and_comes_before_the_decoder(monkeypatch):
    monkeypatch.delenv("ORBBEC_NVJPEG_HARDWARE", raising=False)
    monkeypatch.setattr(oio, "_decoder_created", False)
    with pytest.raises(TypeError, match="hardware_engine"):
        oio.configure_decoder(hardware_engine=0)
    with pytest.raises(TypeError, match="threads"):
        oio.configure_decoder(threads=2.0)
    with pytest.raises(ValueError, match="threads must be at least 1"):
        oio.configure_decoder(threads=0)
    assert "ORBBEC_NVJPEG_HARDWARE" not in os.environ  # nothing set by a refused call
    oio.configure_decoder(hardware_engine=False)
    assert os.environ["ORBBEC_NVJPEG_HARDWARE"] == "0"
    oio.configure_decoder()
    assert os.environ["ORBBEC_NVJPEG_HARDWARE"] == "1"
    monkeypatch.setattr(oio, "_decoder_created", True)  # as after a GPU decode
    with pytest.raises(RuntimeError, match="call configure_decoder first"):
        oio.configure_decoder(hardware_engine=False)


@pytest.mark.skipif(oio._C.with_nvjpeg, reason="orbbec is built with nvJPEG here")
def test_a_build_without_nvjpeg_says_so_for_the_decoder_stats():
    with pytest.raises(RuntimeError, match="decoder_stats: orbbec was built without nvJPEG"):
        oio.decoder_stats()


_CONFIGURE_PROBE = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from jpeg_files import encode, photo
import orbbec.io as oio
oio.configure_decoder(hardware_engine=sys.argv[2] == "1", threads=2)
files = [encode(photo(i, (375, 500))) for i in range(4)] * 8
out = oio.decode_jpeg(files)
torch.cuda.synchronize()
s = oio.decoder_stats()
try:
    oio.configure_decoder(hardware_engine=True)
    late = "accepted"
except RuntimeError:
    late = "refused"
print(s["hybrid_images"], s["hardware_images"], s["hardware_available"], late)
"""


@requires_nvjpeg
@pytest.mark.parametrize("engine", ["0", "1"])
def test_gpu_configure_decoder_chooses_the_paths(engine):
    # The decoder is made once per process: a fresh process each.
    env = subprocess_env()
    env.pop("ORBBEC_NVJPEG_HARDWARE", None)
    run = subprocess.run([sys.executable, "-c", _CONFIGURE_PROBE, os.path.dirname(os.path.abspath(__file__)), engine],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    hybrid, hardware, available, late = run.stdout.split()[-4:]
    assert late == "refused"
    if engine == "0":
        assert (int(hybrid), int(hardware)) == (32, 0)
    elif available != "True":
        pytest.skip("no hardware JPEG engine on this GPU: everything takes the hybrid path")
    else:
        assert int(hardware) > 0 and int(hybrid) + int(hardware) == 32


@requires_nvjpeg
@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_gpu_exif_orientation(orientation):
    jpeg = with_exif_orientation(encode(photo(2, (64, 96))), orientation)
    shown = decode_jpeg(jpeg, apply_exif_orientation=True)
    ref = cv2_decode(jpeg, exif=True)
    assert _close(shown, ref)
    assert decode_jpeg(jpeg).shape == cv2_decode(jpeg).shape


@requires_nvjpeg
def test_gpu_roi_is_the_crop():
    files = [encode(photo(i, (480, 640))) for i in range(8)]
    rois = [(16 * i, 8 * i, 200 + 8 * i, 120) for i in range(8)]
    full = decode_jpeg(files)
    crops = decode_jpeg(files, roi=rois)
    for f, c, (x, y, w, h) in zip(full, crops, rois):
        assert c.shape == (h, w, 3)
        assert (c.int() - f[y:y + h, x:x + w].int()).abs().float().mean() < 1.0


@requires_nvjpeg
def test_gpu_one_pixel_large_image_and_batch_of_512():
    one = encode(np.full((1, 1, 3), (10, 200, 90), np.uint8), sampling="444")
    img = decode_jpeg(one)
    assert img.shape == (1, 1, 3) and _diff(img, cv2_decode(one))[2] <= 4
    big = encode(np.tile(photo(3, (1000, 1000)), (8, 8, 1)), quality=75)
    img = decode_jpeg([big])[0]
    assert _close(img, cv2_decode(big))
    files = [encode(photo(i, (24 + i % 7, 32 + i % 5))) for i in range(512)]
    out = decode_jpeg(files)
    for j in (0, 137, 511):
        assert _close(out[j], cv2_decode(files[j]))


@requires_nvjpeg
def test_gpu_results_are_ordered_on_the_current_stream():
    files = [encode(photo(i, (720, 1280))) for i in range(16)]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out = decode_jpeg(files)
        sums = torch.stack([o.sum(dtype=torch.int64) for o in out]).cpu()  # on `side`, no extra sync
    expected = torch.tensor([int(cv2_decode(f).astype(np.int64).sum()) for f in files])
    assert ((sums - expected).abs().float() / expected.float()).max() < 0.01


@requires_nvjpeg
@pytest.mark.parametrize("path", [0, 1, "started"])
def test_gpu_decode_never_writes_memory_that_queued_kernels_still_read(path):
    # nvJPEG's hardware engine writes as soon as it is called, whatever is queued on its stream. Free
    # tensors of the outputs' size while reductions of them are still queued behind a long kernel,
    # then decode: if the decoder got their blocks, the reductions would read decoded pixels.
    # "started": start_decode, whose images are views of one block per batch (the freed tensor is
    # one block of the batch's size then).
    files = [encode(photo(i, (240, 320))) for i in range(32)]

    def decode():
        if path == "started":
            return oio.start_decode(files).result()[0]
        return oio._decode_cuda(files, "RGB", [None] * 32, False, torch.device("cuda"), only_path=path)[0]
    for _ in range(2):
        decode()
    torch.cuda.synchronize()
    values = torch.arange(1, 33, device="cuda", dtype=torch.uint8)
    if path == "started":  # 240 * 320 * 3 is a multiple of 512: the batch's block has exactly this size
        block = values.view(32, 1, 1, 1).expand(32, 240, 320, 3).contiguous()
        held = list(block.unbind(0))
    else:
        held = [torch.full((240, 320, 3), int(v), dtype=torch.uint8, device="cuda") for v in values]
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # about 0.1 s of queued work on the current stream
    sums = torch.stack([h.sum(dtype=torch.int64) for h in held])
    del held  # the caching allocator may hand these blocks out again on this stream
    if path == "started":
        del block
    imgs = decode()
    expected = values.long() * (240 * 320 * 3)
    assert torch.equal(sums, expected), (sums - expected).nonzero().flatten().tolist()
    for img, f in zip(imgs[:4], files):
        assert _close(img, cv2_decode(f))


def _own_device_bytes():
    """Device memory this process holds by NVML (the caching allocator's and nvJPEG's), or None
    where NVML is missing or does not list the process (other PID namespace)."""
    try:
        import pynvml
        pynvml.nvmlInit()
        bus = torch.cuda.get_device_properties(torch.cuda.current_device()).pci_bus_id
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid == os.getpid() and p.usedGpuMemory is not None:
                return int(p.usedGpuMemory)
    except Exception:
        return None
    return None


@requires_nvjpeg
def test_gpu_memory_stays_flat_over_1000_batches():
    rng = np.random.default_rng(3)
    sizes = [(int(h), int(w)) for h, w in zip(rng.integers(16, 900, 24), rng.integers(16, 1300, 24))]
    files = [encode(photo(i, s)) for i, s in enumerate(sizes)]
    held = []
    for b in range(1000):
        pick = rng.integers(0, len(files), int(rng.integers(1, 33)))
        out = decode_jpeg([files[k] for k in pick])
        assert len(out) == len(pick)
        if b in (299, 999):
            torch.cuda.synchronize()
            held.append((_own_device_bytes(), torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved()))
    assert held[1][2] - held[0][2] < 64 << 20, held  # PyTorch's cache: within 64 MiB
    if held[0][0] is not None and held[1][0] is not None:
        assert held[1][0] - held[0][0] < 64 << 20, held  # this process on the device: within 64 MiB
    elif "PYTEST_XDIST_WORKER" not in os.environ:
        assert held[0][1] - held[1][1] < 64 << 20, held  # free device memory: within 64 MiB
    else:
        pytest.skip("the decoder's memory outside PyTorch's cache was not checked: NVML does not list this "
                    "process and other test processes share the GPU (PyTorch's cache was checked)")


def test_cpu_started_decode_gives_decode_jpegs_images_and_errors():
    # On the CPU start_decode decodes before it returns; result() is decode_jpeg's list with
    # on_error="skip" plus each image's error message ('' when it decoded).
    files = [encode(photo(i, (60 + 8 * i, 90))) for i in range(4)]
    files[2] = b"\x89PNG\r\n\x1a\n not a jpeg"
    images, errors = oio.start_decode(files, device="cpu", mode="BGR").result()
    for i, (got, f) in enumerate(zip(images, files)):
        if i == 2:
            assert got is None and "PNG" in errors[i]
        else:
            assert errors[i] == "" and np.array_equal(got.numpy(), cv2_decode(f, "BGR"))
    with pytest.raises(TypeError, match="start_decode: data must be a list"):
        oio.start_decode(files[0], device="cpu")
    with pytest.raises(ValueError, match="start_decode: mode"):
        oio.start_decode(files, device="cpu", mode="HSV")


@requires_nvjpeg
def test_gpu_started_decodes_match_decode_jpeg_whatever_order_they_are_taken_in():
    # start_decode queues batches for the decoder and returns at once (the loader prepares the next
    # batch meanwhile); results taken in any order equal decode_jpeg's, a bad image of a batch comes
    # back as None with its error, and a started decode never taken must not crash or lose memory.
    batches = [[encode(photo(i + 8 * k, (120 + 8 * k, 160 + 16 * k))) for i in range(8)] for k in range(4)]
    batches[2][3] = b"\xff\xd8 not a jpeg"
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        started = [oio.start_decode(b) for b in batches]
        dropped = oio.start_decode(batches[1])
        del dropped
        results = [s.result() for s in reversed(started)][::-1]
    stream.synchronize()
    for k, (b, (images, errors)) in enumerate(zip(batches, results)):
        expected = decode_jpeg(b, on_error="skip")
        for i, (got, want) in enumerate(zip(images, expected)):
            if k == 2 and i == 3:
                assert got is None and want is None and errors[i]
            else:
                assert torch.equal(got, want) and not errors[i], (k, i)
    assert started[0].result()[0] is results[0][0]  # taken once, kept
    # A started batch's images are views of one allocation, each at a 512-byte boundary; decode_jpeg
    # gives each image its own.
    images = [img for img in results[0][0]]
    assert len({img.untyped_storage().data_ptr() for img in images}) == 1
    assert all(img.data_ptr() % 512 == 0 and img.is_contiguous() for img in images)
    assert len({img.untyped_storage().data_ptr() for img in decode_jpeg(batches[0])}) == len(batches[0])


_ENGINE_EXHAUSTED_PROBE = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from jpeg_files import encode, photo
import orbbec.io as oio
files = [encode(photo(i, (375, 500))) for i in range(6)] * 4
out = oio.decode_jpeg(files)
torch.cuda.synchronize()
torch.save([t.cpu() for t in out], sys.argv[2])
s = oio.decoder_stats()
print(repr((s["hybrid_images"], s["hardware_images"], s["hardware_available"], s["hardware_unavailable"])))
"""


@requires_nvjpeg
@pytest.mark.skipif(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1,
                    reason="it takes every JPEG engine state of the GPU for a moment, which would fail the "
                           "decoders of the tests running beside it: run it without -n")
def test_gpu_a_decoder_without_engine_states_takes_the_hybrid_path(tmp_path):
    """The GPU's JPEG engine has a limited number of decoder states (with many processes on one GPU
    their creation fails). A decoder asking for more than exist (ORBBEC_NVJPEG_LANE_SETS) does without
    the engine, says why once, and decodes every image on the hybrid path: the same pixels as a
    decoder told not to use the engine."""
    def probe(name, **env):
        path = tmp_path / f"{name}.pt"
        run = subprocess.run([sys.executable, "-c", _ENGINE_EXHAUSTED_PROBE, os.path.dirname(os.path.abspath(__file__)),
                              str(path)], env=subprocess_env(**env), capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        return ast.literal_eval(run.stdout.strip().splitlines()[-1]), torch.load(path), run.stderr

    (hybrid, hardware, available, reason), images, warned = probe("exhausted", ORBBEC_NVJPEG_LANE_SETS="1000")
    if not available and not reason:
        pytest.skip("no hardware JPEG engine on this GPU: everything takes the hybrid path")
    assert not available and "nvjpegJpegStateCreate" in reason and "allocator failure" in reason, reason
    assert "JPEG engine is not available to this process" in warned
    assert (hybrid, hardware) == (24, 0)
    (hybrid_only, _, _, _), want, _ = probe("hybrid", ORBBEC_NVJPEG_HARDWARE="0")
    assert hybrid_only == 24 and len(images) == len(want) == 24
    assert all(torch.equal(a, b) for a, b in zip(images, want))
