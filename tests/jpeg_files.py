"""JPEG files for the decode tests, encoded with OpenCV from the sample photographs: every chroma
sampling, grayscale, progressive, restart markers, EXIF orientation tags, broken buffers and
frames cut short."""
import functools

import cv2
import numpy as np

from conftest import sample_photos

SAMPLINGS = {
    "444": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444,
    "422": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422,
    "420": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420,
    "440": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440,
    "411": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411,
}


@functools.lru_cache(maxsize=64)
def _photos(size):
    return sample_photos(size)


def photo(i, size=None):
    """Sample photograph i mod 4 (BGR), resized to size=(h, w). Shared: do not write into it."""
    return _photos(None if size is None else tuple(size))[i % 4]


def encode(img, quality=90, sampling="420", progressive=False, restart=0, optimize=False):
    params = [cv2.IMWRITE_JPEG_QUALITY, quality]
    if img.ndim == 3:
        params += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, SAMPLINGS[sampling]]
    if progressive:
        params += [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]
    if restart:
        params += [cv2.IMWRITE_JPEG_RST_INTERVAL, restart]
    if optimize:
        params += [cv2.IMWRITE_JPEG_OPTIMIZE, 1]
    ok, buf = cv2.imencode(".jpg", img, params)
    assert ok
    return buf.tobytes()


def variants(size=(240, 320)):
    """name -> JPEG bytes for every kind of file the decoders must handle."""
    out = {}
    for k, s in enumerate(SAMPLINGS):
        out[f"sampling-{s}"] = encode(photo(k, size), sampling=s)
    out["gray"] = encode(cv2.cvtColor(photo(1, size), cv2.COLOR_BGR2GRAY))
    out["progressive"] = encode(photo(2, size), progressive=True)
    out["restart"] = encode(photo(3, size), restart=4)
    out["optimized"] = encode(photo(0, size), optimize=True)
    out["odd-size"] = encode(photo(1, (size[0] + 7, size[1] + 5)))
    return out


def with_exif_orientation(jpeg: bytes, orientation: int) -> bytes:
    """The JPEG with an EXIF APP1 segment holding only the orientation tag, after its SOI marker."""
    tiff = b"II*\0" + (8).to_bytes(4, "little") + (1).to_bytes(2, "little")
    tiff += (0x0112).to_bytes(2, "little") + (3).to_bytes(2, "little") + (1).to_bytes(4, "little")
    tiff += orientation.to_bytes(2, "little") + b"\0\0" + (0).to_bytes(4, "little")
    payload = b"Exif\0\0" + tiff
    app1 = b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload
    return jpeg[:2] + app1 + jpeg[2:]


def broken(good: bytes):
    """name -> buffer that no decoder may accept."""
    rng = np.random.default_rng(7)
    header = bytearray(good)
    header[4:300] = rng.integers(0, 256, 296, dtype=np.uint8).tobytes()  # segment lengths, tables, frame header
    ok, png = cv2.imencode(".png", photo(0, (32, 32)))
    return {
        "corrupt": bytes(header),
        "truncated": good[: len(good) // 2],
        "empty": b"",
        "png": png.tobytes(),
        "huge-header": with_frame_size(good, 65500, 65500),
    }


def with_frame_size(jpeg: bytes, height: int, width: int) -> bytes:
    """The JPEG with its frame header claiming another size (the scan data stays as it is)."""
    from orbbec.io._buffers import jpeg_frame

    b = bytearray(jpeg)
    at = jpeg_frame(jpeg).offset
    b[at + 5:at + 9] = bytes([height >> 8, height & 255, width >> 8, width & 255])
    return bytes(b)


def cv2_decode(jpeg: bytes, mode="RGB", reduce=1, exif=False):
    """What cv2.imdecode gives, in the layout of orbbec.io (HWC, RGB/BGR/GRAY[..., None])."""
    gray = mode == "GRAY"
    if reduce == 1:
        flags = cv2.IMREAD_GRAYSCALE if gray else cv2.IMREAD_COLOR
    else:
        flags = getattr(cv2, f"IMREAD_REDUCED_{'GRAYSCALE' if gray else 'COLOR'}_{reduce}")
    if not exif:
        flags |= cv2.IMREAD_IGNORE_ORIENTATION
    img = cv2.imdecode(np.frombuffer(jpeg, np.uint8), flags)
    if gray:
        return img[:, :, None]
    return img[:, :, ::-1].copy() if mode == "RGB" else img


def cut_short(jpeg: bytes, rows: int) -> np.ndarray:
    """The JPEG with its frame header saying `rows` rows (a multiple of its MCU height)."""
    from orbbec.io._buffers import jpeg_frame, with_height
    cut = np.frombuffer(jpeg, np.uint8).copy()
    with_height(cut, jpeg_frame(jpeg), rows)
    return cut


def cuttable_variants():
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

