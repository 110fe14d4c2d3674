"""Benchmark metrics: throughput per GPU, scaling efficiency, MFU, energy.

Every efficiency here is defined so that 1 is perfect scaling and lower is worse
(a value above 1 is super-linear scaling):

- from a per-GPU throughput x (tokens/s/GPU, images/s/GPU): e(n) = x(n) / x(n_min).
  Ideal strong and weak scaling both keep the per-GPU throughput constant.
- from a time t the run took:
  strong scaling (fixed total work): e(n) = t(n_min) * n_min / (t(n) * n);
  weak scaling (fixed work per GPU): e(n) = t(n_min) / t(n).
- from the median time of one batch (fixed per-GPU batch in both modes):
  e(n) = t(n_min) / t(n).
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


def efficiency_from_time(
    time: float, gpus: int, time_at_min: float, gpus_at_min: int, scaling: str
) -> float:
    """Efficiency from a duration; ``scaling`` is "strong" or "weak" (see the module doc)."""
    if not time or math.isnan(time) or math.isnan(time_at_min):
        return math.nan
    if scaling == "strong":
        return time_at_min * gpus_at_min / (time * gpus)
    if scaling == "weak":
        return time_at_min / time
    raise ValueError(f"scaling must be 'strong' or 'weak', not {scaling!r}")


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


def batch_times_trimmed(times: Sequence[float]) -> list[float]:
    """Batch times without the first and the last batch (start-up and a partial batch)."""
    return list(times[1:-1]) if len(times) > 2 else []


def vision_run_metrics(
    batches: list[dict], epochs: list[dict], *, measured_epoch: int, gpus: int
) -> dict[str, float]:
    """Per-run figures of a vision run; ``measured_epoch`` counts from 1 (the seed used 4 of 5).

    The epoch records carry the global image count of that epoch and its full and
    training-only times; batch records carry this rank's synchronised batch wall time.
    """
    epoch = next((e for e in epochs if e.get("epoch") == measured_epoch), None)
    if epoch is None and epochs:
        epoch = epochs[-1]  # fewer epochs than asked: the last one, flagged below
    times = batch_times_trimmed(
        [b["time_s"] for b in batches if b.get("epoch") == (epoch or {}).get("epoch")]
    )
    if epoch is None:
        return {"epochs_logged": 0}
    images = epoch["images"]
    return {
        "epochs_logged": len(epochs),
        "measured_epoch": epoch["epoch"],
        "epoch_time_s": epoch["epoch_time_s"],
        "train_time_s": epoch["train_time_s"],
        "median_batch_time_s": median(times),
        "images_per_s": images / epoch["train_time_s"],
        "images_per_s_per_gpu": images / epoch["train_time_s"] / gpus,
        "energy_j_per_gpu": epoch.get("energy_j_per_gpu", math.nan),
        "energy_j_per_image": (
            epoch["energy_j_per_gpu"] * gpus / images if "energy_j_per_gpu" in epoch else math.nan
        ),
        "final_loss": epoch.get("loss", math.nan),
    }
