"""Megatron's distributed optimizer where there is no fused Adam (no Transformer Engine, no
Apex: LUMI's image, the H200 of the first GPU run), reproduced with Megatron's own code
on the CPU: why megatron_args.as_run drops it for campaigns that resume there.

Megatron then builds torch's AdamW (megatron/core/optimizer/__init__.py). At a save the
optimizer has stepped, and ``DistributedOptimizer.state_dict`` reads its one ``step``.
At a load it has not: the state is empty, and the same function asserts (the GPU run:
segment 1 saved at iteration 30, segment 2 died at start-up with an AssertionError).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch


def test_megatrons_torch_adamw_fallback_saves_but_cannot_load():
    from megatron.core import optimizer as megatron_optimizer
    from megatron.core.optimizer import distrib_optimizer

    # This machine has neither TE nor Apex: Megatron's fallback, as on LUMI.
    assert not distrib_optimizer.HAVE_APEX_OR_TE
    assert megatron_optimizer.Adam is torch.optim.AdamW
    state_dict = distrib_optimizer.DistributedOptimizer.state_dict

    param = torch.nn.Parameter(torch.zeros(4))
    # A resume: the optimizer is built and its checkpoint loaded before its first step.
    loading = SimpleNamespace(optimizer=megatron_optimizer.Adam([param]), grad_scaler=None)
    with pytest.raises(AssertionError):
        state_dict(loading)

    # A save in the segment that trained: one step taken, the state dict is made.
    training = SimpleNamespace(optimizer=megatron_optimizer.Adam([param]), grad_scaler=None)
    param.grad = torch.ones(4)
    training.optimizer.step()
    assert "optimizer" in state_dict(training)
