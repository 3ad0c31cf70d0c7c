"""The loader tests' dataset: real photographs as JPEG bytes with labels and boxes, the transform
they draw with, and a loader's epoch by dataset index."""
import numpy as np
import torch

from jpeg_files import encode, photo

import orbbec.augment as A

SIZES = [(120, 160), (150, 150), (96, 200), (180, 140)]


class JpegDataset(torch.utils.data.Dataset):
    """Real photographs as JPEG bytes, a label and (per sample a different number of) boxes; `bad`
    indices hold a truncated file."""

    def __init__(self, n=22, bad=()):
        self.n, self.bad = n, set(bad)
        self.jpegs = [encode(photo(i, SIZES[i % 4]), quality=92) for i in range(n)]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        h, w = SIZES[i % 4]
        boxes = np.array([[5, 6, w // 2, h // 2], [w // 3, h // 4, w - 4, h - 3], [1, 1, 9, 9]], np.float32)[: 1 + i % 3]
        data = self.jpegs[i][: len(self.jpegs[i]) // 2] if i in self.bad else self.jpegs[i]
        return {"image": data, "boxes": boxes, "labels": np.arange(len(boxes)) + 10, "label": i}


def make_transform(colour=True):
    ts = [A.RandomResizedCrop(48, scale=(0.3, 1.0)), A.RandomHorizontalFlip()]
    if colour:
        ts.append(A.ColorJitter(0.3, 0.3, 0.3, 0.05))
    return A.Compose(ts + [A.Normalize(A.IMAGENET_MEAN, A.IMAGENET_STD)])


def by_index(loader):
    """{dataset index (the 'label'): (image, boxes) of that sample} over one epoch."""
    out = {}
    for b in loader:
        for k, label in enumerate(b["label"].tolist()):
            out[label] = (b["image"][k].cpu(), b["boxes"][k, : int(b["num_boxes"][k])].cpu())
    return out

