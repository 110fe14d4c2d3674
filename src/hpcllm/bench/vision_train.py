"""The vision benchmark: ResNet trained with DDP from the LMDB reader, timed per batch.

Run by ``bench_vision`` through the cluster's launcher (one process per GPU, or per CPU
"node" on a laptop): ``python -m hpcllm.bench.vision_train --settings point.json --data
train.lmdb``. Rank 0 prints JSON lines to stdout:

- ``start``: the settings, world size, device, FLOPs of one training image;
- ``batch``: per batch, its wall time from data ready to the optimizer step done, with
  device synchronisation, and images/s over all ranks;
- ``epoch``: per epoch, the full time (data loading included) and the training-only time
  (the sum of batch times), images, mean loss, and GPU energy where there are counters;
- ``end``.

The model is Hugging Face ``transformers``' ResNet (``ResNetConfig()`` is ResNet-50 v1.5,
as torchvision's): torchvision has no build for the CPU torch these machines carry, and
its CUDA build cannot load next to it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from PIL import Image
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from torch.utils.flop_counter import FlopCounterMode
from transformers import ResNetConfig, ResNetForImageClassification

from hpcllm.bench.energy import EnergyCounter

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

# Model sizes: resnet50 is the benchmark's; the small ones keep tests and laptops quick.
MODELS = {
    "resnet50": {},
    "resnet18": {
        "layer_type": "basic",
        "depths": [2, 2, 2, 2],
        "hidden_sizes": [64, 128, 256, 512],
    },
    "resnet_tiny": {
        "layer_type": "basic",
        "embedding_size": 8,
        "depths": [1, 1],
        "hidden_sizes": [8, 16],
    },
}


class TrainTransform:
    """ImageNet training augmentation (random resized crop 0.08-1, flip, normalise) in
    Pillow and NumPy, the steps of torchvision's RandomResizedCrop/RandomHorizontalFlip."""

    def __init__(self, size: int) -> None:
        self.size = size

    def crop_box(self, width: int, height: int) -> tuple[int, int, int, int]:
        area = width * height
        for _ in range(10):
            target = area * random.uniform(0.08, 1.0)
            ratio = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
            w = round(math.sqrt(target * ratio))
            h = round(math.sqrt(target / ratio))
            if 0 < w <= width and 0 < h <= height:
                x, y = random.randint(0, width - w), random.randint(0, height - h)
                return x, y, x + w, y + h
        side = min(width, height)  # fallback: the central square
        x, y = (width - side) // 2, (height - side) // 2
        return x, y, x + side, y + side

    def __call__(self, image: Image.Image) -> torch.Tensor:
        image = image.resize((self.size, self.size), Image.BILINEAR, box=self.crop_box(*image.size))
        if random.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        array = (np.asarray(image, dtype=np.float32) / 255.0 - MEAN) / STD
        return torch.from_numpy(array.transpose(2, 0, 1).copy())


def build_model(name: str, num_classes: int) -> torch.nn.Module:
    if name not in MODELS:
        raise ValueError(f"unknown vision model {name!r}; known: {', '.join(MODELS)}")
    return ResNetForImageClassification(ResNetConfig(num_labels=num_classes, **MODELS[name]))


def train_flops_per_image(model: torch.nn.Module, image_size: int, device: torch.device) -> int:
    """FLOPs of forward and backward for one image, counted by PyTorch's FlopCounterMode."""
    x = torch.zeros(1, 3, image_size, image_size, device=device)
    counter = FlopCounterMode(display=False)
    with counter:
        model(pixel_values=x).logits.sum().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def _emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def _init_distributed() -> tuple[int, int, int, torch.device]:
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return rank, world, local_rank, device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def run(settings: dict, data: str, local_storage: str | None = None) -> None:
    rank, world, local_rank, device = _init_distributed()
    seed = settings.get("seed", 1234)
    random.seed(seed + rank)
    torch.manual_seed(seed)
    staged = None
    if settings.get("stage_in") and local_storage:
        from hpcllm.vision.stage_in import remove_staged, stage_in, staged_path

        # One copy per node, made by its first rank; the others wait for it. Each run has
        # its own folder: runs sharing a node must not remove each other's copies.
        base = Path(os.path.expandvars(local_storage))
        if not base.is_dir():
            raise FileNotFoundError(
                f"node-local storage {base} (from {local_storage}) does not exist; fix "
                "local_storage in the cluster facts file or set stage_in: false"
            )
        dest = (
            base
            / f"hpcllm-{os.environ.get('HPCLLM_RUN_ID', 'run')}-{os.environ.get('SLURM_JOB_ID', os.getppid())}"
        )
        if local_rank == 0:
            dest.mkdir(exist_ok=True)
            staged = stage_in(data, dest)
        _barrier(world)
        data = str(staged or staged_path(data, dest))
    try:
        _train(settings, data, rank, world, device)
    finally:
        _barrier(world)
        if staged is not None:
            remove_staged(staged)
            shutil.rmtree(dest, ignore_errors=True)
        if world > 1:
            dist.destroy_process_group()


def _train(settings: dict, data: str, rank: int, world: int, device: torch.device) -> None:
    from hpcllm.vision.lmdb_dataset import LMDBImageDataset

    size = settings["image_size"]
    dataset = LMDBImageDataset(data, TrainTransform(size), repeat=settings.get("repeat", 1))
    num_classes = settings.get("num_classes") or len(dataset.classes)
    batch = settings["batch_per_gpu"]
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=1234)
    workers = settings.get("workers", 4)
    loader = DataLoader(
        dataset,
        batch_size=batch,
        sampler=sampler,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        drop_last=True,
        persistent_workers=workers > 0,
    )
    if len(loader) == 0:
        raise ValueError(
            f"{data}: {len(dataset)} images over {world} ranks give no full batch of {batch}; "
            "lower batch_per_gpu or raise repeat"
        )
    model = build_model(settings.get("model", "resnet50"), num_classes).to(device)
    flops = train_flops_per_image(model, size, device)
    ddp = DistributedDataParallel(model) if world > 1 else model
    optimizer = torch.optim.SGD(
        ddp.parameters(), lr=settings.get("learning_rate", 0.1), momentum=0.9, weight_decay=1e-4
    )
    amp = settings["precision"] == "amp"
    # AMP: fp16 with loss scaling on GPUs (the seed's setting), bf16 on the CPU.
    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, enabled=amp and amp_dtype == torch.float16)
    loss_fn = torch.nn.CrossEntropyLoss()
    energy = EnergyCounter(device.index or 0) if device.type == "cuda" else None
    max_batches = settings.get("max_batches_per_epoch") or len(loader)
    if rank == 0:
        _emit(
            {
                "event": "start",
                **settings,
                "world_size": world,
                "device": str(
                    device if device.type == "cpu" else torch.cuda.get_device_name(device)
                ),
                "train_flops_per_image": flops,
                "samples": len(dataset),
                "batches_per_epoch": min(max_batches, len(loader)),
                "energy_counter": bool(energy and energy.available),
            }
        )
    for epoch in range(1, settings["epochs"] + 1):
        sampler.set_epoch(epoch)
        ddp.train()
        energy_start = energy.joules() if energy and energy.available else None
        _sync(device)
        epoch_start = time.perf_counter()
        train_time, images, loss_sum = 0.0, 0, 0.0
        for i, (x, y) in enumerate(loader):
            if i >= max_batches:
                break
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            _sync(device)
            start = time.perf_counter()
            context = torch.autocast(device.type, dtype=amp_dtype) if amp else nullcontext()
            with context:
                loss = loss_fn(ddp(pixel_values=x).logits, y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            _sync(device)
            seconds = time.perf_counter() - start
            train_time += seconds
            images += x.shape[0] * world
            loss_sum += loss.item()
            if rank == 0:
                _emit(
                    {
                        "event": "batch",
                        "epoch": epoch,
                        "batch": i,
                        "time_s": seconds,
                        "images_per_s": x.shape[0] * world / seconds,
                        "loss": loss.item(),
                    }
                )
        _barrier(world)
        epoch_time = time.perf_counter() - epoch_start
        record = {
            "event": "epoch",
            "epoch": epoch,
            "epoch_time_s": epoch_time,
            "train_time_s": train_time,
            "images": images,
            "loss": loss_sum / max(1, min(max_batches, len(loader))),
        }
        if energy_start is not None:
            record["energy_j_per_gpu"] = energy.joules() - energy_start
        if rank == 0:
            _emit(record)
    if rank == 0:
        _emit({"event": "end"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hpcllm.bench.vision_train", description=__doc__
    )
    parser.add_argument("--settings", required=True, help="JSON file of the sweep point's settings")
    parser.add_argument("--data", required=True, help="the LMDB directory to train on")
    parser.add_argument("--local-storage", help="node-local directory to stage the LMDB to")
    args = parser.parse_args(argv)
    settings = json.loads(Path(args.settings).read_text())
    run(settings, args.data, args.local_storage)
    return 0


if __name__ == "__main__":
    sys.exit(main())
