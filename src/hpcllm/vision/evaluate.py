"""Distributed validation: every image of the val split read exactly once across ranks.

torch's ``DistributedSampler`` pads the last round with repeated images so that every
rank gets as many (and ``drop_last`` drops some instead): either way the accuracy is not
that of the val split. Here rank r reads images r, r + world, r + 2 world, ... (ranks
may differ by one image), and the counts are summed over the ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.distributed as dist
from torch.utils.data import Sampler


class ShardSampler(Sampler[int]):
    """Indices ``rank, rank + world, ...`` below ``length``: a partition, no padding."""

    def __init__(self, length: int, rank: int, world: int) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} not in 0..{world - 1}")
        self.length, self.rank, self.world = length, rank, world

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.length, self.world))

    def __len__(self) -> int:
        return len(range(self.rank, self.length, self.world))


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    loader,
    device: torch.device,
    autocast: AbstractContextManager | None = None,
) -> dict[str, float]:
    """Top-1 and top-5 accuracy, mean loss and image count over all ranks' shards."""
    model.eval()
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
    # correct top-1, correct top-k, images, summed loss
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast or nullcontext():
            logits = model(x)
        k = min(5, logits.shape[1])
        top = logits.topk(k, dim=1).indices
        hits = top.eq(y[:, None])
        sums += torch.stack(
            [
                hits[:, 0].sum(),
                hits.any(dim=1).sum(),
                torch.tensor(len(y), device=device),
                loss_fn(logits.float(), y),
            ]
        ).to(torch.float64)
    if dist.is_initialized():
        dist.all_reduce(sums)
    top1, topk, images, loss = sums.tolist()
    return {
        "val_images": int(images),
        "val_top1": top1 / images if images else float("nan"),
        "val_top5": topk / images if images else float("nan"),
        "val_loss": loss / images if images else float("nan"),
    }
