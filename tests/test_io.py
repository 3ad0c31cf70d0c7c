"""orbbec.io.decode_jpeg on the CPU path against cv2.imdecode (identical), bad input on both paths,
sizes, frame headers, configure_decoder's arguments. The GPU path: test_io_cuda.py."""
import os

import numpy as np
import pytest
import torch

from decode_bounds import close_to_cv2, requires_nvjpeg
from jpeg_files import (CUT_ROWS_THAT_MAY_DIFFER, broken, cut_short, cuttable_variants, cv2_decode, encode, photo,
                        variants, with_exif_orientation, with_frame_size)

import orbbec.io as oio
from orbbec.io import JpegDecodeError, decode_jpeg


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
                assert close_to_cv2(out[k], ref)


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


def test_cpu_a_frame_cut_short_decodes_to_the_whole_images_top_rows():
    for name, (jpeg, frame) in cuttable_variants().items():
        full = cv2_decode(jpeg)
        for rows in range(frame.mcu_height, frame.height, 3 * frame.mcu_height):
            img = decode_jpeg(cut_short(jpeg, rows), device="cpu")
            keep = rows - CUT_ROWS_THAT_MAY_DIFFER
            assert img.shape == (rows,) + full.shape[1:], (name, rows)
            assert torch.equal(img[:keep], torch.from_numpy(full[:keep])), (name, rows)
    with pytest.raises(ValueError, match="cannot cut"):
        cut_short(encode(photo(0, (64, 64))), 40)  # not a multiple of the MCU height


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
