"""The benchmark workloads of docs/workloads.md: sample photographs and per-image matrices."""
from __future__ import annotations

import collections

import numpy as np

WARP_WORKLOADS = {
    # name: (batch, input (h, w), output (h, w))
    "face": (512, (250, 250), (112, 112)),
    "det": (64, (640, 640), (640, 640)),
    "hd": (16, (1080, 1920), (540, 960)),
}
VARSIZE_SHAPES = [(375, 500), (480, 640), (333, 500), (500, 375), (427, 640), (640, 480)]


def pack_jpegs(files) -> tuple:
    """`files` back to back in one writable uint8 array, and the n + 1 offsets of each in it (the
    layout of the loader's packed batches, orbbec.io.PackedImages)."""
    offsets = np.concatenate([[0], np.cumsum([len(f) for f in files], dtype=np.int64)])
    return np.frombuffer(b"".join(files), np.uint8).copy(), offsets.tolist()


def photos_bgr(batch: int, in_hw, shapes=None) -> list:
    """Image i: astronaut, chelsea, coffee, rocket cycled, resized (INTER_LINEAR) to in_hw (or
    shapes[i % len(shapes)]), rolled right by 37*i pixels, RGB -> BGR; uint8 HWC."""
    import cv2
    from skimage import data

    base = [getattr(data, n)() for n in ("astronaut", "chelsea", "coffee", "rocket")]
    out = []
    for i in range(batch):
        h, w = shapes[i % len(shapes)] if shapes else in_hw
        img = cv2.resize(base[i % 4], (w, h), interpolation=cv2.INTER_LINEAR)
        out.append(np.ascontiguousarray(np.roll(img, 37 * i, axis=1)[:, :, ::-1]))
    return out


def forward_matrices(batch: int, in_hws, out_hw, seed: int = 0) -> np.ndarray:
    """cv2-convention (src -> dst) matrices, [batch, 2, 3] float64, drawn as docs/workloads.md says."""
    import cv2

    rng = np.random.default_rng(seed)
    oh, ow = out_hw
    mats = []
    for i in range(batch):
        h, w = in_hws[i % len(in_hws)] if isinstance(in_hws, list) else in_hws
        angle = rng.uniform(-30, 30)
        s = rng.uniform(0.8, 1.2) * min(oh / h, ow / w)
        m = cv2.getRotationMatrix2D((w / 2, h / 2), angle, s)
        m[0, 2] += ow / 2 - w / 2 + rng.uniform(-0.1, 0.1) * ow
        m[1, 2] += oh / 2 - h / 2 + rng.uniform(-0.1, 0.1) * oh
        m[0, 2] += rng.uniform(-0.5, 0.5)
        m[1, 2] += rng.uniform(-0.5, 0.5)
        mats.append(m)
    return np.stack(mats)


# JPEG sets for decoding and the pipeline: name -> (width, height, batch, images).
JPEG_SETS = {
    "jpeg-1080p": (1920, 1080, 64, 128),
    "jpeg-500x375": (500, 375, 128, 1024),
    "jpeg-250": (250, 250, 256, 1024),
    "jpeg-640": (640, 640, 64, 256),
}

# Pipeline workloads: name -> (JPEG set, batch, what the transform is). tools/benchmark_pipeline.py
# builds the same transform for every pipeline it compares.
PIPELINE_WORKLOADS = {
    "cls-1080p": ("jpeg-1080p", 64, "RandomResizedCrop(224) + RandomHorizontalFlip + Normalize"),
    "cls-500x375": ("jpeg-500x375", 128, "RandomResizedCrop(224) + RandomHorizontalFlip + Normalize"),
    "face": ("jpeg-250", 256, "AlignFaces(112) on 5 landmarks + RandomHorizontalFlip + Normalize"),
    "det": ("jpeg-640", 64, "RandomAffine(10, (0.1, 0.1), (0.75, 1.25)) + RandomHorizontalFlip + Normalize, "
                             "640 x 640, boxes"),
}


def face_landmarks(count: int, size: int = 250) -> np.ndarray:
    """[count, 5, 2] landmarks as a face detector would give them on size x size crops: the 112 x 112
    ArcFace template scaled by uniform(1.3, 1.7), rotated by uniform(-20, 20) degrees about its centre,
    centred at size/2 + uniform(-10, 10) (numpy.random.default_rng(6))."""
    template = np.array([[38.2946, 51.6963], [73.5318, 51.5014], [56.0252, 71.7366],
                         [41.5493, 92.3655], [70.7299, 92.2041]])
    rng = np.random.default_rng(6)
    out = []
    for _ in range(count):
        s, a = rng.uniform(1.3, 1.7), np.radians(rng.uniform(-20, 20))
        R = s * np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
        c = size / 2 + rng.uniform(-10, 10, 2)
        out.append((template - template.mean(0)) @ R.T + c)
    return np.stack(out).astype(np.float32)


def det_boxes(count: int, size: int = 640) -> list:
    """Per image 1 to 20 boxes [N, 4] xyxy: top-left uniform in the image, sides uniform in [16, 256)
    clipped to it (numpy.random.default_rng(7))."""
    rng = np.random.default_rng(7)
    out = []
    for _ in range(count):
        n = int(rng.integers(1, 21))
        xy = rng.uniform(0, size - 16, (n, 2))
        wh = rng.uniform(16, 256, (n, 2))
        out.append(np.concatenate([xy, np.minimum(xy + wh, size)], 1).astype(np.float32))
    return out


def photo_crops_bgr(count: int, in_hw, seed: int = 5) -> list:
    """Photographs without seams: image i is photograph i mod 4 resized to in_hw = (H, W), scaled up by
    uniform(1.0, 1.6) and cropped back to H x W at a uniform offset, mirrored when i is odd; BGR uint8
    HWC (numpy.random.default_rng(seed) draws scale, then y, then x offset)."""
    import cv2
    from skimage import data

    h, w = in_hw
    base = [cv2.resize(getattr(data, n)()[:, :, ::-1], (w, h), interpolation=cv2.INTER_LINEAR)
            for n in ("astronaut", "chelsea", "coffee", "rocket")]
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        s = rng.uniform(1.0, 1.6)
        big = cv2.resize(base[i % 4], (int(round(w * s)), int(round(h * s))), interpolation=cv2.INTER_LINEAR)
        y = int(rng.uniform(0, big.shape[0] - h + 1))
        x = int(rng.uniform(0, big.shape[1] - w + 1))
        img = big[y:y + h, x:x + w]
        if i % 2:
            img = img[:, ::-1]
        out.append(np.ascontiguousarray(img))
    return out


def jpeg_set(name: str, images: int | None = None, sampling: str = "420") -> list:
    """Encoded JPEGs of a set: photo_crops_bgr(images, (H, W)) encoded by cv2.imencode at quality 90.
    `sampling` (444, 422, 420, 440) sets the chroma subsampling; 420 is cv2's default."""
    import cv2

    w, h, _, count = JPEG_SETS[name]
    factor = getattr(cv2, f"IMWRITE_JPEG_SAMPLING_FACTOR_{sampling}")
    out = []
    for img in photo_crops_bgr(images or count, (h, w)):
        ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_SAMPLING_FACTOR, factor])
        assert ok
        out.append(buf.tobytes())
    return out


def repeat_to_epoch(items: list, batch: int, batches: int = 64) -> list:
    """A benchmark dataset repeated to at least `batches` batches per epoch, as long as a real
    dataset's, each copy its own sample index (so its own parameters). With a few batches per epoch
    the loaders' restart at each epoch (an empty prefetch queue) dominates: 6-8 ms of GPU idle per
    training step for orbbec's loader with 4 batches per epoch (H100, tools/profile_loader.py)."""
    return items * max(1, -(-batches * batch // len(items)))


def full_batches(seq, batch: int) -> list:
    """seq in consecutive batches of `batch`, the last partial one left out."""
    return [seq[k:k + batch] for k in range(0, len(seq) - batch + 1, batch)]


class DecodeAhead:
    """Drives orbbec.io.start_decode as orbbec.data's loader does (and as DALI's prefetch queue
    runs): up to `in_flight` batches started (by default the loader's DECODES_IN_FLIGHT, read when
    built), the oldest taken once the newest is started, so the decoder never waits for the caller's
    Python. Calling it with a batch returns the images of the batch taken then (0 while fewer are
    started); drain() takes the rest. A batch is a list of encoded images, or an
    orbbec.io.PackedImages (one buffer, as the loader's workers pack it)."""

    def __init__(self, device="cuda", in_flight=None):
        import orbbec.data._stream as loader_stream  # (its module, so that a probe's setting counts)

        self.device = device
        self.in_flight = loader_stream.DECODES_IN_FLIGHT if in_flight is None else in_flight
        self.started = collections.deque()

    def __call__(self, batch) -> int:
        from orbbec.io import start_batch_decode

        self.started.append(start_batch_decode(batch, device=self.device))  # (a list or a PackedImages)
        return self._take() if len(self.started) >= self.in_flight else 0

    def _take(self) -> int:
        return len(self.started.popleft().result()[0])

    def drain(self) -> int:
        taken = 0
        while self.started:
            taken += self._take()
        return taken
