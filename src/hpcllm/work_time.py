"""How long a GPU job's work takes, from its FLOPs and an assumed rate: its time limit.

A job's time limit is what the allocation is charged for and what the scheduler backfills
with, so it is sized from the work (a training segment's iterations, a benchmark point's
iterations), not a constant: the FLOPs of the work divided by the GPUs' assumed sustained
rate (``gpu.assumed_tflops`` in the cluster file), times a margin, plus the start-up
(container, framework, data index, first checkpoint save), clamped to the partition's
longest time limit.

FLOPs per iteration of a GPT model (Narayanan et al. 2021, "Efficient large-scale
language model training on GPU clusters using Megatron-LM", eq. 3; the formula behind
Megatron-LM's own "TFLOP/s per GPU"): ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))``, forward
and backward pass (3 x 24 B s l h^2 ...); full activation recomputation runs the forward
pass once more (96 instead of 72). B global batch, s sequence, l layers, h hidden, V vocab.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Margin on the estimate: the rate is an assumption, and the first iterations (warm-up,
# kernel autotuning, NCCL set-up) are slower than the rest.
MARGIN = 1.5
# Minutes a GPU job spends outside its iterations: container start, framework and NCCL
# start-up, the data index, loading and saving a checkpoint.
STARTUP_MINUTES = 15
# Time limits are rounded up to this many minutes.
ROUND_MINUTES = 5


def flops_per_iteration(
    model: dict[str, Any], global_batch: int, vocab_size: int, recompute: str = "none"
) -> float:
    """Model FLOPs of one training iteration (see the module's docstring)."""
    h, s, layers = model["hidden_size"], model["seq_length"], model["num_layers"]
    f = model.get("ffn_hidden_size") or 4 * h
    passes = 96 if recompute == "full" else 72
    # Megatron's "1" is attention (8 B s h^2 forward) + an MLP of 4h (16 B s h^2); another
    # MLP width f scales the MLP's share: (8 + 4 f/h) / 24.
    mlp_scale = (2 + f / h) / 6
    return (
        passes
        * global_batch
        * s
        * layers
        * h
        * h
        * (mlp_scale + s / (6 * h) + vocab_size / (12 * layers * h))
    )


@dataclass(frozen=True)
class WorkTime:
    """The estimate of a job's work and the time limit it gets."""

    flops: float
    gpus: int
    tflops_per_gpu: float  # the rate assumed
    work_minutes: float  # FLOPs / (GPUs x rate)
    limit_minutes: int  # margin and start-up added, rounded, clamped
    max_minutes: int  # the partition's longest limit
    clamped: bool  # the work does not fit in the partition's longest limit

    def describe(self) -> str:
        return (
            f"{self.flops:.3g} FLOPs on {self.gpus} GPUs at an assumed "
            f"{self.tflops_per_gpu:g} TFLOP/s per GPU: {self.work_minutes:,.0f} min of work, "
            f"time limit {self.limit_minutes} min"
        )


def time_limit(flops: float, gpus: int, tflops_per_gpu: float, max_minutes: int) -> WorkTime:
    """The time limit for ``flops`` of work on ``gpus`` GPUs (see the module's docstring)."""
    work = flops / (gpus * tflops_per_gpu * 1e12) / 60
    wanted = work * MARGIN + STARTUP_MINUTES
    limit = int(math.ceil(wanted / ROUND_MINUTES) * ROUND_MINUTES)
    return WorkTime(
        flops=flops,
        gpus=gpus,
        tflops_per_gpu=tflops_per_gpu,
        work_minutes=work,
        limit_minutes=min(limit, max_minutes),
        max_minutes=max_minutes,
        clamped=limit > max_minutes,
    )
