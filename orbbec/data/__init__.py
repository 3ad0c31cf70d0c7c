"""orbbec.data: the training input pipeline on the GPU.

    from orbbec.data import GPULoader
    from orbbec.augment import Compose, RandomResizedCrop, RandomHorizontalFlip, Normalize, IMAGENET_MEAN, IMAGENET_STD
    loader = GPULoader(dataset, batch_size=256, shuffle=True, num_workers=4, seed=0,
                       transform=Compose([RandomResizedCrop(224), RandomHorizontalFlip(),
                                          Normalize(IMAGENET_MEAN, IMAGENET_STD)]))
    for images, labels in loader:       # images: float32 [256, 3, 224, 224] on the GPU, normalised
        ...

The dataset's items are JPEG bytes (or paths, or decoded uint8 HWC arrays) with their targets. See
docs/data.md.
"""
from ._loader import GPULoader
from ._order import epoch_indices

__all__ = ["GPULoader", "epoch_indices"]
