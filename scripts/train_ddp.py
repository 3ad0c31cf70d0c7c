"""A real training loop fed by orbbec's GPU loader, on one GPU or several under torchrun:
torchvision's ResNet-50 (or -18), AMP, SGD, channels_last, DistributedDataParallel.

    torchrun --nproc-per-node 1 scripts/train_ddp.py --steps 200
    torchrun --nproc-per-node 2 scripts/train_ddp.py --steps 200 --checkpoint /tmp/ckpt.pt
    python scripts/train_ddp.py --data synthetic          # the same loop on a batch already on the GPU

Data: --data-dir DIR reads the images of an ImageFolder tree (class = sub-folder); without it the loop
trains on the benchmark's ImageNet-like JPEG set (docs/workloads.md, jpeg-500x375) held in memory.
Each rank loads its own shard (DistributedSampler's order) onto its own GPU; the augmentation of a
sample depends on (seed, epoch, index) only, so ranks never repeat each other's draws.
--checkpoint saves the model, optimiser and loader state every --save-every steps; a run started
again with the same --checkpoint resumes mid-epoch where it stopped.
--decoder training (the default here) sets the GPU decoder for a loader beside a training step that
needs far fewer images per second than the decoder gives (docs/data.md, "Beside a training step");
--decoder default keeps the throughput setting, for a model fast enough to wait for its input.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import torch
import torch.distributed as dist
# Imported before init_process_group on purpose. DistributedDataParallel imports this module, and
# its functions take `group=group.WORLD` as a default argument. Imported after init, those defaults
# keep the default process group alive, so destroy_process_group does not end gloo's threads. The
# group is then destroyed during interpreter exit, which now and then aborted a rank ("terminate
# called without an active exception"). Imported first, the defaults are None.
import torch.distributed.nn  # noqa: F401

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))


# What torchvision's ImageFolder takes; files other than JPEGs are decoded in the loader's workers.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def image_items(data_dir, images=None):
    if data_dir:
        classes = sorted(d for d in os.listdir(data_dir) if os.path.isdir(os.path.join(data_dir, d)))
        return [(os.path.join(data_dir, c, f), k) for k, c in enumerate(classes)
                for f in sorted(os.listdir(os.path.join(data_dir, c))) if f.lower().endswith(IMAGE_EXTENSIONS)]
    from workloads import jpeg_set

    return [(f, i % 1000) for i, f in enumerate(jpeg_set("jpeg-500x375", images))]


def tiny_cnn():
    """--arch tiny: a small CNN for smoke runs (CI), same loop otherwise."""
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 16, 3, stride=4), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=4), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 1000))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", choices=["orbbec", "synthetic"], default="orbbec")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--arch", default="resnet50", help="a torchvision.models name, or 'tiny' (smoke runs)")
    ap.add_argument("--batch-size", type=int, default=256, help="per GPU")
    ap.add_argument("--steps", type=int, default=100, help="training steps to run (after --warmup)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--images", type=int, default=None, help="use the first N images of the built-in set")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--save-every", type=int, default=50)
    ap.add_argument("--decoder", choices=("training", "default"), default="training",
                    help="training: orbbec.io.configure_decoder(**orbbec.io.TRAINING_DECODER)")
    args = ap.parse_args()
    if args.decoder == "training":
        import orbbec.io

        orbbec.io.configure_decoder(**orbbec.io.TRAINING_DECODER)  # before the first GPU decode

    import orbbec.augment as A
    from orbbec.data import GPULoader

    if args.arch != "tiny":
        import torchvision
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    model = tiny_cnn() if args.arch == "tiny" else getattr(torchvision.models, args.arch)(num_classes=1000)
    model = model.to(device, memory_format=torch.channels_last)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    scaler = torch.amp.GradScaler(enabled=device.type == "cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    transform = A.Compose([A.RandomResizedCrop(224), A.RandomHorizontalFlip(),
                           A.Normalize(A.IMAGENET_MEAN, A.IMAGENET_STD)])
    loader = GPULoader(image_items(args.data_dir, args.images), args.batch_size, transform=transform, shuffle=True, drop_last=True,
                       num_workers=args.workers, prefetch=3, seed=args.seed, device=device)
    step = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        ck = torch.load(args.checkpoint, map_location=device, weights_only=False)
        (model.module if distributed else model).load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        loader.load_state_dict(ck["loader"][rank])
        step = ck["step"]
        print(f"rank {rank}: resumed at step {step}, loader {ck['loader'][rank]}\n", end="", flush=True)

    def batches():
        if args.data == "synthetic":  # the ceiling: one batch already on the GPU, reused
            x = torch.randn(args.batch_size, 3, 224, 224, device=device)
            y = torch.randint(0, 1000, (args.batch_size,), device=device)
            while True:
                yield x, y
        while True:
            for images, labels in loader:
                yield images, labels.to(device, non_blocking=True)

    it = batches()
    first_labels = None
    t0, timed = None, 0
    for k in range(args.warmup + args.steps):
        if k == args.warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        x, y = next(it)
        if first_labels is None:
            first_labels = y[:8].tolist()
        x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16 if device.type == "cpu" else torch.float16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        step += 1
        timed += x.shape[0] if k >= args.warmup else 0
        if args.checkpoint and step % args.save_every == 0:
            states = [None] * world
            if distributed:
                dist.all_gather_object(states, loader.state_dict())
            else:
                states = [loader.state_dict()]
            if rank == 0:
                torch.save({"model": (model.module if distributed else model).state_dict(), "opt": opt.state_dict(),
                            "loader": states, "step": step}, args.checkpoint)
    if device.type == "cuda":
        torch.cuda.synchronize()
    rate = timed / (time.perf_counter() - t0)
    # One write per line: the ranks share one stdout, and separate writes interleave.
    print(f"rank {rank}/{world} {device}: {args.arch} {args.data} batch {args.batch_size}: {rate:.0f} images/s "
          f"({args.steps} steps, loss {loss.item():.3f}); first labels {first_labels}\n", end="", flush=True)
    if distributed:
        # DDP's reducer goes before its process group, so that destroy_process_group ends the
        # group's threads now rather than during interpreter exit (see the import above).
        del model, opt
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
