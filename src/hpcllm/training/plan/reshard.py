"""Which layout changes a Megatron-LM campaign's checkpoints survive, and the checkpoint
format a campaign saves in (``layout.reshardable_checkpoints``).

What the pin (Megatron-LM core_v0.19.0, ``--ckpt-format torch_dist``, its default:
megatron/training/config/training_config.py:486) loads after a change of TP, PP or DP:

- The model's weights are ``ShardedTensor``s of the whole tensor (dist_checkpointing), so
  they load on any TP/PP/DP; so does the optimizer state *without* the distributed
  optimizer: ``Float16OptimizerWithFloat16Params.sharded_state_dict`` keys each Adam
  state by its parameter's ShardedTensor (megatron/core/optimizer/optimizer.py:1138-1189).
  tests/training/test_reshard_megatron.py saves TP=2 and loads TP=1 with Megatron Core.
- The distributed optimizer saves in the format named by the checkpoint's content
  metadata ``distrib_optim_sharding_type`` (megatron/training/checkpointing.py:497-505):
  ``dp_reshardable`` by default, ``fully_reshardable`` with
  ``--dist-ckpt-optim-fully-reshardable`` (training_config.py:592, "fully reshardable
  (TP/PP/EP/DP) as opposed to plain DP reshardability"). ``dp_reshardable`` stores
  Megatron's gradient buckets as they are (distrib_optimizer.py:1828-1860: "allows
  checkpoint resharding only in DP dimension"); a load with another (TP, PP) raises
  "(TP, PP) mismatch after resume ... not supported for DistributedOptimizer with
  sharding type dp_reshardable" at start-up (checkpointing.py:2246-2255, the formats it
  accepts: ``DistributedOptimizer.checkpoint_fully_reshardable_formats``,
  distrib_optimizer.py:127). ``fully_reshardable`` gathers each state on DP rank 0 into
  one tensor per parameter at the save and slices it at the load (distrib_optimizer.py:
  1477-1483, 1690-1730): any TP/PP/DP, at the cost of that gather (save time, DP rank 0's
  memory).
- Even over DP, ``dp_reshardable`` needs the same buckets: a bucket closes when it holds
  ``bucket_size`` parameters (distrib_optimizer.py:568-570), and the bucket size follows
  DP: ``max(40M, 1M x DP)`` (megatron/core/distributed/distributed_data_parallel.py:
  68-69), none (one bucket) without ``--overlap-grad-reduce`` (:71-72), which
  hpcllm.models.megatron_args passes for DP > 1 only. So DP 1 <-> 2 or past 40 changes
  them; DP 2..40 among themselves keeps them.
- Transformer Engine's and Megatron's local layers name their parameters differently:
  ``--transformer-impl`` stays weight-determining (hpcllm.training.plan.settings).
- The RNG state is keyed by (PP, TP) rank and is not loaded after a TP/PP change
  (checkpointing.py:2171-2192): with dropout 0 (megatron_args) nothing depends on it.

The torch engine's checkpoint is one full state: any DP, nothing to check here.
"""

from __future__ import annotations

from typing import Any

# The experiment key and which format it asks for are the command line's (the models
# floor, below this one: hpcllm.models.megatron_args passes the flag).
from hpcllm.models.megatron_args import RESHARDABLE_KEY as KEY
from hpcllm.models.megatron_args import wants_fully_reshardable

# Megatron's names for the distributed optimizer's checkpoint formats (its content
# metadata ``distrib_optim_sharding_type``); NO_DISTRIBUTED_OPTIMIZER: the optimizer
# state follows the model's sharded tensors.
FULLY = "fully_reshardable"
DP_ONLY = "dp_reshardable"
NO_DISTRIBUTED_OPTIMIZER = "none"
# The record's keys (training_settings.json, section "layout").
RECORD_KEYS = ("layout.tp", "layout.pp", "layout.dp", "layout.checkpoint_format")

# Megatron's default gradient bucket: max(40M, 1M x DP) parameters
# (distributed_data_parallel.py:68-69).
_BUCKET_FLOOR, _BUCKET_PER_DP = 40_000_000, 1_000_000


def checkpoint_format(experiment: dict[str, Any], transformer_impl: str | None) -> str:
    """The optimizer's checkpoint format the experiment's segments save in: the one of
    what runs (megatron_args.as_run drops the distributed optimizer for resuming runs
    of Megatron's local layers)."""
    from hpcllm.models.megatron_args import as_run

    runs, _ = as_run(experiment, transformer_impl or "transformer_engine", resumes=True)
    if not runs["layout"].get("distributed_optimizer"):
        return NO_DISTRIBUTED_OPTIMIZER
    return FULLY if wants_fully_reshardable(experiment) else DP_ONLY


def layout_settings(prepared, transformer_impl: str | None) -> dict[str, Any]:
    """What a Megatron checkpoint is sharded by and how: TP, PP, DP and the optimizer's
    checkpoint format (empty for the torch engine, whose checkpoint is one full state)."""
    if prepared.experiment["engine"] != "megatron":
        return {}
    lay = prepared.layout
    return {
        "layout.tp": lay.tp,
        "layout.pp": lay.pp,
        "layout.dp": lay.dp,
        "layout.checkpoint_format": checkpoint_format(prepared.experiment, transformer_impl),
    }


def weakest(one: str | None, other: str | None) -> str | None:
    """The format that allows the fewer layout changes (a folder whose newest checkpoint
    may be in either)."""
    order = (DP_ONLY, FULLY, NO_DISTRIBUTED_OPTIMIZER)
    known = [f for f in (one, other) if f in order]
    return min(known, key=order.index) if known else (one or other)


def _bucket_size(dp: int) -> int | None:
    return None if dp == 1 else max(_BUCKET_FLOOR, _BUCKET_PER_DP * dp)


def _text(settings: dict[str, Any]) -> str:
    return f"TP={settings['layout.tp']} PP={settings['layout.pp']} DP={settings['layout.dp']}"


def layout_refusal(saved: dict[str, Any], new: dict[str, Any]) -> str | None:
    """Why checkpoints saved with ``saved`` (:func:`layout_settings`, as recorded) cannot
    be resumed with the layout ``new``, or None where Megatron reshards them."""
    if not saved or not new:
        return None
    fmt = saved.get("layout.checkpoint_format")
    if fmt in (FULLY, NO_DISTRIBUTED_OPTIMIZER):
        return None
    tp_pp = ("layout.tp", "layout.pp")
    if any(saved.get(k) != new.get(k) for k in tp_pp):
        why = (
            "which reshards over DP only: Megatron-LM stops at start-up with '(TP, PP) "
            "mismatch after resume' on a TP or PP change"
        )
        back = f"go back to tp: {saved['layout.tp']}, pp: {saved['layout.pp']}"
    elif _bucket_size(saved["layout.dp"]) != _bucket_size(new["layout.dp"]):
        why = (
            "which stores the optimizer state in Megatron's gradient buckets, whose size "
            "follows DP (one bucket at DP=1, else max(40M, 1M x DP) parameters): between "
            "these DPs the buckets differ and the load fails"
        )
        back = (
            f"go back to DP={saved['layout.dp']}"
            if saved["layout.dp"] == 1 or saved["layout.dp"] > 40
            else "use a DP between 2 and 40"
        )
    else:
        return None
    return (
        f"saved with {_text(saved)} in the distributed optimizer's '{fmt}' checkpoint "
        f"format, {why}; the experiment now asks for {_text(new)}. Either {back}, or "
        "restart. For this campaign to change its layout "
        f"later: set layout.{KEY}: true, train one more segment on the saved layout (it "
        f"then saves '{FULLY}', which any layout loads; its saves gather the optimizer "
        "state on one rank and take longer), then change the layout"
    )
