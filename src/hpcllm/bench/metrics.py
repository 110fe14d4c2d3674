"""Benchmark metrics: throughput per GPU, scaling efficiency, MFU, energy.

Every efficiency here is defined so that 1 is perfect scaling and lower is worse
(a value above 1 is super-linear scaling):

- from a per-GPU throughput x (tokens/s/GPU, images/s/GPU): e(n) = x(n) / x(n_min).
  Ideal strong and weak scaling both keep the per-GPU throughput constant.
- from a time t the run took, by what stays fixed as the GPUs grow:
  a fixed total amount of work (a vision epoch: the same images at every node count):
  e(n) = t(n_min) * n_min / (t(n) * n);
  a fixed amount of work per GPU (one batch of a fixed per-GPU batch): e(n) = t(n_min) / t(n).

The scaling modes are EPICURE's, which count the work *per batch* (its footnote 12): the
vision benchmark's weak scaling keeps the per-GPU batch over the fixed dataset, so its
epoch times are of fixed total work and its median batch time of fixed work per GPU.

Vision timings are EPICURE's: ``t_ep`` the full epoch including validation, ``t_tr`` its
training part, and the batch time from one batch's start (the training loop asks the
data loader for it) to the next batch's start, so data loading counts (:func:`epoch_timings`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from hpcllm.bench.logparse import Iteration


def median(values: Sequence[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def measured(iterations: list[Iteration], warmup: int) -> list[Iteration]:
    """The iterations after the first ``warmup`` ones (the first logged ones of the run)."""
    return iterations[warmup:]


def efficiency_from_throughput(per_gpu: float, per_gpu_at_min: float) -> float:
    if not per_gpu_at_min or math.isnan(per_gpu_at_min) or math.isnan(per_gpu):
        return math.nan
    return per_gpu / per_gpu_at_min


FIXED_WORK = ("total", "per_gpu")


def efficiency_from_time(
    time: float, gpus: int, time_at_min: float, gpus_at_min: int, fixed: str
) -> float:
    """Efficiency from a duration; ``fixed`` says which work the duration is of, the same
    at every node count: "total" or "per_gpu" (see the module doc)."""
    if fixed not in FIXED_WORK:
        raise ValueError(f"fixed must be 'total' or 'per_gpu', not {fixed!r}")
    if not time or math.isnan(time) or math.isnan(time_at_min):
        return math.nan
    if fixed == "total":
        return time_at_min * gpus_at_min / (time * gpus)
    return time_at_min / time


def mfu(tflops_per_gpu: float, peak_tflops: float | None) -> float:
    """Model FLOPs utilisation against the GPU's dense peak (never the sparsity figure)."""
    if not peak_tflops or tflops_per_gpu is None or math.isnan(tflops_per_gpu):
        return math.nan
    return tflops_per_gpu / peak_tflops


def language_run_metrics(
    iterations: list[Iteration],
    *,
    warmup: int,
    gpus: int,
    seq_length: int,
    peak_tflops: float | None,
) -> dict[str, float]:
    """Per-run figures of a language run from its logged iterations (warm-up excluded)."""
    its = measured(iterations, warmup)
    step_s = median([i.elapsed_s for i in its])
    batch = median([i.global_batch_size for i in its if i.global_batch_size])
    tokens_per_s = batch * seq_length / step_s if step_s and not math.isnan(step_s) else math.nan
    tflops = median([i.tflops_per_gpu for i in its if i.tflops_per_gpu is not None])
    energy = median([i.energy_j_per_gpu for i in its if i.energy_j_per_gpu is not None])
    tokens_per_iter = batch * seq_length
    losses = [i.lm_loss for i in its if i.lm_loss is not None]
    return {
        "iterations_logged": len(iterations),
        "iterations_measured": len(its),
        "step_time_s": step_s,
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_gpu": tokens_per_s / gpus if gpus else math.nan,
        "tflops_per_gpu": tflops,
        "mfu": mfu(tflops, peak_tflops),
        "energy_j_per_gpu_per_iter": energy,
        "energy_j_per_token": energy * gpus / tokens_per_iter if tokens_per_iter else math.nan,
        "final_loss": losses[-1] if losses else math.nan,
    }


def batch_times_from_starts(starts: Sequence[float], train_end: float) -> list[float]:
    """Per-batch times: each batch from its start to the next one's; the last one to the
    end of training. Loading a batch is part of its time, so the times add up to the
    training part of the epoch from the first batch's start."""
    ends = [*starts[1:], train_end]
    return [end - start for start, end in zip(starts, ends)]


def epoch_timings(
    epoch_start: float, batch_starts: Sequence[float], train_end: float, epoch_end: float
) -> dict:
    """EPICURE's timings of one epoch from clock readings (seconds, one clock):
    ``t_ep`` (epoch start to the end of validation), ``t_tr`` (epoch start to the end of
    the last training step) and the per-batch times (:func:`batch_times_from_starts`)."""
    if not epoch_start <= train_end <= epoch_end:
        raise ValueError("expected epoch start <= end of training <= end of the epoch")
    return {
        "t_ep": epoch_end - epoch_start,
        "t_tr": train_end - epoch_start,
        "batch_times": batch_times_from_starts(batch_starts, train_end),
    }


def batch_times_trimmed(times: Sequence[float]) -> list[float]:
    """Batch times without the first and the last batch (start-up and a partial batch)."""
    return list(times[1:-1]) if len(times) > 2 else []


def vision_run_metrics(
    batches: list[dict], epochs: list[dict], *, measured_epoch: int, gpus: int
) -> dict[str, float]:
    """Per-run figures of a vision run; ``measured_epoch`` counts from 1 (EPICURE: 4 of 5).

    The epoch records carry the global image count of that epoch, t_ep (``epoch_time_s``),
    t_tr (``train_time_s``), the validation results and the job's energy; the batch records
    carry rank 0's batch times (start to next start). Fields a run did not log (energy
    without counters, validation without a val split) are NaN, i.e. empty in the CSV.
    """
    epoch = next((e for e in epochs if e.get("epoch") == measured_epoch), None)
    if epoch is None and epochs:
        epoch = epochs[-1]  # fewer epochs than asked: the last one
    if epoch is None:
        return {"epochs_logged": 0}
    times = batch_times_trimmed([b["time_s"] for b in batches if b.get("epoch") == epoch["epoch"]])
    images = epoch["images"]
    return {
        "epochs_logged": len(epochs),
        "measured_epoch": epoch["epoch"],
        "epoch_time_s": epoch["epoch_time_s"],
        "train_time_s": epoch["train_time_s"],
        "val_time_s": epoch.get("val_time_s", math.nan),
        "median_batch_time_s": median(times),
        "images_per_s": images / epoch["train_time_s"],
        "images_per_s_per_gpu": images / epoch["train_time_s"] / gpus,
        "val_top1": epoch.get("val_top1", math.nan),
        "val_top5": epoch.get("val_top5", math.nan),
        "val_images": epoch.get("val_images", math.nan),
        "energy_j": epoch.get("energy_j", math.nan),
        "energy_j_per_gpu": epoch.get("energy_j_per_gpu", math.nan),
        "energy_j_per_image": epoch.get("energy_j_per_image", math.nan),
        "final_loss": epoch.get("loss", math.nan),
    }
