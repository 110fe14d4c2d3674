"""Where a layout change of a distributed-optimizer checkpoint stops on this CPU.

The wanted test (issue 49): save a ``fully_reshardable`` checkpoint with optimizer state
at one DP/TP and load it at another, comparing the optimizer state. On a machine without
Transformer Engine or Apex (this one, LUMI's image) Megatron builds torch's AdamW, and
every load of a DistributedOptimizer checkpoint, in any format, stops before it reads a
byte: ``DistributedOptimizer.sharded_state_dict(is_loading=True)`` (megatron/core/
optimizer/distrib_optimizer.py:1531 at the pin, ``state_dict = self.state_dict()``)
calls ``state_dict`` (:825), whose non-Apex/TE branch asserts one ``step`` in the
optimizer's state (:838-839), empty before the first step. The dummy state Megatron
makes for loading (``_init_optimizer_states_with_dummy_values``, :1643) is only on the
Megatron-FSDP path. So the reshard of the optimizer state is not testable here; the
plan keeps such sites off the distributed optimizer for campaigns that resume
(megatron_args.as_run). This test runs Megatron's own call path to that line.
"""

from __future__ import annotations

import traceback
from types import SimpleNamespace

import pytest
import torch


def test_a_fully_reshardable_load_stops_at_the_step_assertion_without_te_or_apex():
    from megatron.core import optimizer as megatron_optimizer
    from megatron.core.optimizer import distrib_optimizer

    assert not distrib_optimizer.HAVE_APEX_OR_TE
    cls = distrib_optimizer.DistributedOptimizer
    assert "fully_reshardable" in cls.checkpoint_fully_reshardable_formats

    def optimizer_of(param):
        me = SimpleNamespace(
            ddp_config=SimpleNamespace(use_megatron_fsdp=False),
            optimizer=megatron_optimizer.Adam([param]),
            grad_scaler=None,
        )
        me.state_dict = lambda: cls.state_dict(me)
        return me

    loading = optimizer_of(torch.nn.Parameter(torch.zeros(4)))
    with pytest.raises(AssertionError) as stopped:
        cls.sharded_state_dict(
            loading, {}, is_loading=True,
            metadata={"distrib_optim_sharding_type": "fully_reshardable"},
        )  # fmt: skip
    frames = traceback.extract_tb(stopped.value.__traceback__)
    last = frames[-1]
    assert last.filename.endswith("megatron/core/optimizer/distrib_optimizer.py")
    assert (last.name, last.line) == ("state_dict", "assert len(steps) == 1")
    assert [f.name for f in frames[-3:-1]] == ["sharded_state_dict", "<lambda>"]
    print(f"stops at {last.filename}:{last.lineno} ({last.line})")
