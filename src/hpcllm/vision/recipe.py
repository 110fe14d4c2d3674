"""The large-batch training recipe of Goyal et al. 2017, as the PyTorch ImageNet example
and EPICURE use it: SGD with momentum, the learning rate scaled linearly with the global
batch (0.1 per 256 images) and reached by a linear warm-up, no weight decay on BatchNorm
parameters and biases, optional label smoothing. The zero-init of the last BN gamma of
each residual block is in :mod:`hpcllm.vision.models`.

After the warm-up the rate stays constant: a benchmark of a few epochs never reaches the
step decays (epochs 30, 60, 80) of a full training.
"""

from __future__ import annotations

import torch
from torch import nn

REFERENCE_BATCH = 256


def scaled_lr(base_lr: float, global_batch: int, reference_batch: int = REFERENCE_BATCH) -> float:
    """Linear scaling rule: ``base_lr`` per ``reference_batch`` images."""
    return base_lr * global_batch / reference_batch


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on convolution and linear weights only; none on BN gammas/betas and
    biases (every parameter with fewer than 2 dimensions)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim > 1 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def warmup_factor(step: int, warmup_steps: int, start_factor: float) -> float:
    """Multiplier of the target rate at ``step``: linear from ``start_factor`` to 1 over
    ``warmup_steps`` steps, then 1."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return 1.0
    return start_factor + (1.0 - start_factor) * step / warmup_steps


def make_optimizer(
    model: nn.Module,
    settings: dict,
    global_batch: int,
    steps_per_epoch: int,
) -> tuple[torch.optim.SGD, torch.optim.lr_scheduler.LambdaLR, float]:
    """SGD with momentum and its per-step warm-up schedule; also the target rate.

    Settings: ``learning_rate`` (per 256 images, default 0.1), ``momentum`` (0.9),
    ``weight_decay`` (1e-4), ``warmup_epochs`` (5, Goyal et al.). The warm-up starts at
    the unscaled rate (Goyal et al.: from eta to k*eta), never above the target.
    """
    base = settings.get("learning_rate", 0.1)
    target = scaled_lr(base, global_batch)
    optimizer = torch.optim.SGD(
        param_groups(model, settings.get("weight_decay", 1e-4)),
        lr=target,
        momentum=settings.get("momentum", 0.9),
    )
    warmup_steps = round(settings.get("warmup_epochs", 5) * steps_per_epoch)
    start = min(1.0, base / target)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_factor(step, warmup_steps, start)
    )
    return optimizer, schedule, target


def loss_function(settings: dict) -> nn.Module:
    return nn.CrossEntropyLoss(label_smoothing=settings.get("label_smoothing", 0.0))
