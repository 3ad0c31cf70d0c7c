"""orbbec.io.decode_jpeg's GPU path: against cv2 within the decoders' IDCT and upsampling differences
(decode_bounds.py), both nvJPEG paths, memory, streams, started decodes and the decoder's settings."""
import ast
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import subprocess_env
from decode_bounds import GPU_MEAN_BOUND, GPU_P999_BOUND, close_to_cv2, diff_to_cv2, requires_nvjpeg
from jpeg_files import (CUT_ROWS_THAT_MAY_DIFFER, cut_short, cuttable_variants, cv2_decode, encode, photo, variants,
                        with_exif_orientation)

import orbbec.io as oio
from orbbec.io import decode_jpeg


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
        mean, p999, _ = diff_to_cv2(img, ref)
        assert mean < GPU_MEAN_BOUND and p999 <= GPU_P999_BOUND, (name, mean, p999)


@requires_nvjpeg
@pytest.mark.parametrize("path", [0, 1])
def test_gpu_a_frame_cut_short_decodes_to_the_whole_images_top_rows(path):
    """The loader's partial decode: each path, told by the frame header that the image ends early,
    decodes its first rows as it decodes them in the whole image, and reports no error for the
    coded data it leaves unread."""
    names, cut, full, rows_of = [], [], [], []
    for name, (jpeg, frame) in cuttable_variants().items():
        for rows in range(frame.mcu_height, frame.height, 5 * frame.mcu_height):
            names.append(name)
            cut.append(cut_short(jpeg, rows))
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
            assert close_to_cv2(img, ref)


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
        assert close_to_cv2(a, cv2_decode(files[i]))
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
        assert close_to_cv2(a, ref) and close_to_cv2(b, ref), i
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


_PARSE_PROBE = """
import hashlib, json, sys, torch
sys.path.insert(0, sys.argv[1])
from jpeg_files import broken, encode, photo, variants, with_exif_orientation
import orbbec.io as oio
from orbbec._library import _C
files = list(variants().values()) + list(variants((640, 640)).values())
files += [with_exif_orientation(encode(photo(k, (64, 96))), o) for k, o in enumerate(range(1, 9))]
files += list(broken(files[0]).values())
raw = _C.decode_jpeg_cuda([oio.as_buffer(f, 0, True) for f in files], 0, 0, None, -1)
images, errors, _, orientations, paths = raw[:5]
digest = [None if im is None else hashlib.sha1(im.cpu().numpy().tobytes()).hexdigest() for im in images]
print(json.dumps({"failed": [bool(e) for e in errors], "orientations": list(orientations),
                  "paths": list(paths), "digest": digest,
                  "engine": oio.decoder_stats()["hardware_available"]}))
"""


@requires_nvjpeg
def test_gpu_header_only_parse_plans_every_file_as_the_whole_parse_did():
    """plan() reads each file's header only; ORBBEC_NVJPEG_PARSE_WHOLE=1 parses whole bitstreams as
    before. On every kind of file (EXIF orientations 1-8, broken ones too) both must choose the same
    path and orientation, fail the same files, and decode the rest to the same bits. (Not compared:
    nvJPEG's "unsupported" flag on a failed file, which sends it on to OpenCV: on an H200 the whole
    parse flagged the file with a random header and the header parse did not; it fails either way,
    named.)"""
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    runs = {}
    for whole in ("0", "1"):
        env = subprocess_env(ORBBEC_NVJPEG_PARSE_WHOLE=whole)
        run = subprocess.run([sys.executable, "-c", _PARSE_PROBE, tests_dir], env=env, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        runs[whole] = json.loads(run.stdout.strip().splitlines()[-1])
    header, whole = runs["0"], runs["1"]
    for key in ("failed", "orientations", "paths", "digest"):
        assert header[key] == whole[key], key
    assert header["orientations"][-13:-5] == list(range(1, 9))
    assert sum(header["failed"]) == 5 and not any(header["failed"][:-5])  # the broken files, and only they
    if header["engine"]:
        assert 0 in header["paths"] and 1 in header["paths"]  # progressive files take the hybrid path


@requires_nvjpeg
@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_gpu_exif_orientation(orientation):
    jpeg = with_exif_orientation(encode(photo(2, (64, 96))), orientation)
    shown = decode_jpeg(jpeg, apply_exif_orientation=True)
    ref = cv2_decode(jpeg, exif=True)
    assert close_to_cv2(shown, ref)
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
    assert img.shape == (1, 1, 3) and diff_to_cv2(img, cv2_decode(one))[2] <= 4
    big = encode(np.tile(photo(3, (1000, 1000)), (8, 8, 1)), quality=75)
    img = decode_jpeg([big])[0]
    assert close_to_cv2(img, cv2_decode(big))
    files = [encode(photo(i, (24 + i % 7, 32 + i % 5))) for i in range(512)]
    out = decode_jpeg(files)
    for j in (0, 137, 511):
        assert close_to_cv2(out[j], cv2_decode(files[j]))


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
        assert close_to_cv2(img, cv2_decode(f))


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
