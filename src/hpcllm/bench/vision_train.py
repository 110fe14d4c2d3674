"""The vision benchmark as EPICURE runs it: ResNet-50 of the PyTorch ImageNet example with
the large-batch recipe, trained with DDP from the LMDB reader, validated every epoch.

Run by ``bench_vision`` through the cluster's launcher (one process per GPU, or per CPU
"node" on a laptop): ``python -m hpcllm.bench.vision_train --settings point.json --data
train.lmdb --val-data val.lmdb``. Rank 0 prints JSON lines to stdout:

- ``start``: the settings, world size, device, ``model_impl`` (torchvision or the
  transformers fallback), learning rate, FLOPs of one training image;
- ``stage_in``: method and seconds per node of copying the LMDBs to node-local storage;
- ``batch``: per batch, EPICURE's batch time (from its start, the loader asked for it,
  to the next batch's start: data loading included) and images/s over all ranks;
- ``epoch``: ``epoch_time_s`` (t_ep, validation included), ``train_time_s`` (t_tr),
  ``val_time_s``, images, mean loss, top-1/top-5 on the val split, and the energy of
  every GPU of the job where there are counters;
- ``end``.
The definitions are in :mod:`hpcllm.bench.metrics` (``epoch_timings``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from torch.utils.flop_counter import FlopCounterMode

from hpcllm.bench.energy import EnergyCounter, job_energy
from hpcllm.bench.metrics import epoch_timings
from hpcllm.vision.evaluate import ShardSampler, evaluate
from hpcllm.vision.models import build_model
from hpcllm.vision.recipe import loss_function, make_optimizer
from hpcllm.vision.transforms import TrainTransform, ValTransform


def train_flops_per_image(model: torch.nn.Module, image_size: int, device: torch.device) -> int:
    """FLOPs of forward and backward for one image, counted by PyTorch's FlopCounterMode."""
    x = torch.zeros(1, 3, image_size, image_size, device=device)
    counter = FlopCounterMode(display=False)
    with counter:
        model(x).sum().backward()
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
        torch.backends.cudnn.benchmark = True  # fixed input shapes: pick the fastest kernels
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


def run(
    settings: dict, data: str, val_data: str | None = None, local_storage: str | None = None
) -> None:
    rank, world, local_rank, device = _init_distributed()
    seed = settings.get("seed", 1234)
    random.seed(seed + rank)
    torch.manual_seed(seed)
    cleanup = None
    try:
        staged = None
        if settings.get("stage_in") and local_storage:
            from hpcllm.vision.stage_job import stage_for_job

            sources = [data] + ([val_data] if val_data else [])
            copies, staged, cleanup = stage_for_job(
                sources,
                local_storage,
                settings.get("stage_in_method", "copy"),
                rank,
                local_rank,
                timeout_s=settings.get("stage_in_timeout_s"),
            )
            data, val_data = copies[0], (copies[1] if val_data else None)
        _train(settings, str(data), val_data and str(val_data), rank, world, device, staged)
    finally:
        if cleanup is not None:
            cleanup()
        _barrier(world)
        if world > 1:
            dist.destroy_process_group()


def _loader(dataset, batch: int, sampler, workers: int, device, drop_last: bool) -> DataLoader:
    # Persistent workers that prefetch: loading overlaps compute, as in EPICURE's runs.
    extra = {"prefetch_factor": 4, "persistent_workers": True} if workers > 0 else {}
    return DataLoader(
        dataset,
        batch_size=batch,
        sampler=sampler,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        drop_last=drop_last,
        **extra,
    )


def _train(
    settings: dict,
    data: str,
    val_data: str | None,
    rank: int,
    world: int,
    device: torch.device,
    staged: dict | None,
) -> None:
    from hpcllm.vision.lmdb_dataset import LMDBImageDataset

    size = settings["image_size"]
    dataset = LMDBImageDataset(data, TrainTransform(size), repeat=settings.get("repeat", 1))
    num_classes = settings.get("num_classes") or len(dataset.classes)
    batch = settings["batch_per_gpu"]
    workers = settings.get("workers", 4)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=1234)
    loader = _loader(dataset, batch, sampler, workers, device, drop_last=True)
    if len(loader) == 0:
        raise ValueError(
            f"{data}: {len(dataset)} images over {world} ranks give no full batch of {batch}; "
            "lower batch_per_gpu or raise repeat"
        )
    val_loader = None
    if val_data:
        val_set = LMDBImageDataset(val_data, ValTransform(size))
        if val_set.classes != dataset.classes:
            raise ValueError(f"{val_data}: its classes differ from those of {data}; repack both")
        val_loader = _loader(
            val_set, batch, ShardSampler(len(val_set), rank, world), workers, device, False
        )
    model, impl = build_model(
        settings.get("model", "resnet50"), num_classes, settings.get("model_impl", "auto")
    )
    model = model.to(device)
    flops = train_flops_per_image(model, size, device)
    ddp = DistributedDataParallel(model) if world > 1 else model
    steps = min(settings.get("max_batches_per_epoch") or len(loader), len(loader))
    optimizer, schedule, lr = make_optimizer(model, settings, batch * world, steps)
    amp = settings["precision"] == "amp"
    # AMP: fp16 with loss scaling on GPUs, bf16 on the CPU.
    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, enabled=amp and amp_dtype == torch.float16)

    def autocast():
        return torch.autocast(device.type, dtype=amp_dtype) if amp else nullcontext()

    loss_fn = loss_function(settings)
    energy = EnergyCounter(device.index or 0) if device.type == "cuda" else None
    if rank == 0:
        _emit(
            {
                "event": "start",
                **settings,
                "world_size": world,
                "device": str(
                    device if device.type == "cpu" else torch.cuda.get_device_name(device)
                ),
                "model_impl": impl,
                "learning_rate_scaled": lr,
                "train_flops_per_image": flops,
                "samples": len(dataset),
                "val_samples": len(val_loader.dataset) if val_loader else 0,
                "batches_per_epoch": steps,
                "energy_counter": bool(energy and energy.available),
            }
        )
        if staged:
            _emit({"event": "stage_in", **staged})
    for epoch in range(1, settings["epochs"] + 1):
        sampler.set_epoch(epoch)
        ddp.train()
        joules_start = energy.joules() if energy and energy.available else None
        _sync(device)
        _barrier(world)
        epoch_start = time.perf_counter()
        starts, images, loss_sum = [], 0, 0.0
        batches = iter(loader)
        for _ in range(steps):
            starts.append(time.perf_counter())  # the batch starts: the loader is asked for it
            x, y = next(batches)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with autocast():
                loss = loss_fn(ddp(x), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            schedule.step()
            loss_sum += loss.item()  # waits for the step on the device
            images += x.shape[0] * world
        _sync(device)
        train_end = time.perf_counter()
        del batches
        # The bare model: ranks may get one val batch more than others, and DDP's forward
        # could start a collective the others never join.
        val = evaluate(model, val_loader, device, autocast()) if val_loader else {}
        _sync(device)
        _barrier(world)
        epoch_end = time.perf_counter()
        timings = epoch_timings(epoch_start, starts, train_end, epoch_end)
        joules = job_energy(energy.joules() - joules_start if joules_start is not None else None)
        if rank != 0:
            continue
        for i, seconds in enumerate(timings["batch_times"]):
            _emit(
                {
                    "event": "batch",
                    "epoch": epoch,
                    "batch": i,
                    "time_s": seconds,
                    "images_per_s": batch * world / seconds,
                }
            )
        record = {
            "event": "epoch",
            "epoch": epoch,
            "epoch_time_s": timings["t_ep"],
            "train_time_s": timings["t_tr"],
            "val_time_s": epoch_end - train_end,
            "images": images,
            "loss": loss_sum / steps,
            "learning_rate": schedule.get_last_lr()[0],
            **val,
        }
        if joules is not None:
            record["energy_j"] = joules
            record["energy_j_per_gpu"] = joules / world
            record["energy_j_per_image"] = joules / images
        _emit(record)
    if rank == 0:
        _emit({"event": "end"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hpcllm.bench.vision_train", description=__doc__
    )
    parser.add_argument("--settings", required=True, help="JSON file of the sweep point's settings")
    parser.add_argument("--data", required=True, help="the LMDB directory to train on")
    parser.add_argument("--val-data", help="the LMDB directory to validate on every epoch")
    parser.add_argument("--local-storage", help="node-local directory to stage the LMDBs to")
    args = parser.parse_args(argv)
    settings = json.loads(Path(args.settings).read_text())
    run(settings, args.data, args.val_data, args.local_storage)
    return 0


if __name__ == "__main__":
    sys.exit(main())
