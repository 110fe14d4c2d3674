"""What a training campaign was trained with: change tracking of an experiment.

Every setting an engine reads is either

- **weight-determining** (:func:`weight_settings`): the model, the global batch, the
  optimizer and its schedule's peak, warm-up and floor, precision, seed, the data blend and
  split, the tokenizer, the engine, and for Megatron-LM the layout its checkpoints are
  sharded by. A change means a checkpoint trained so far is not the one the new settings
  would have trained; or
- **continuation-safe** (:func:`continuation_settings`): the campaign's length (segments,
  iterations per segment), save, evaluation and log intervals, time margins, attempts,
  threads, and the layout keys that change neither the mathematics nor the checkpoint's
  format. A change continues the campaign from its newest checkpoint.

The weight-determining settings are a param of ``train_segment`` (one ``key=value`` line
each, so Snakemake's params trigger replans every segment of the experiment and its reason
line shows the old and the new values); the data settings (:func:`data_settings`) are a
param of ``prepare_data_cache``. The first segment writes both groups into
``checkpoints/<experiment>/training_settings.json``; every segment compares the
weight-determining ones before its engine starts (:func:`check_checkpoint_settings`) and
refuses a checkpoint trained with others, naming the keys. See docs/training.md, "Changing
an experiment".

Layout (``tp``, ``pp``, DP = GPUs / (TP x PP), the distributed optimizer, Megatron's
``--transformer-impl``): the torch engine's checkpoint is one full state whatever the DP,
and its samples are taken in Megatron's global order, so nodes and processes per node are
continuation-safe there (only the order of floating-point sums changes). Megatron-LM's
layers' parameter names differ between Transformer Engine and its local layers, and the
distributed optimizer's state is another checkpoint content than Adam's: both stay
weight-determining. TP, PP and DP are the **layout** (:func:`hpcllm.training.plan.reshard.
layout_settings`, with the optimizer's checkpoint format), recorded beside the weights and
compared by what Megatron reshards at the pin (:func:`hpcllm.training.plan.reshard.
layout_refusal`): a change it loads continues, one it does not is refused at plan time and
at the segment's start, naming the format. Not a param: a layout change that resumes does
not plan the finished segments again.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from hpcllm.atomic import atomic_path
from hpcllm.training.checkpoints.lease import LEASE

log = logging.getLogger(__name__)

SETTINGS_FILE = "training_settings.json"

# Keys of an experiment's sections that are continuation-safe for either engine.
_CONTINUATION = (
    "segments",
    "iterations_per_segment",
    "save_interval",
    "keep_checkpoints.last",
    "keep_checkpoints.every",
    "eval_interval",
    "eval_iters",
    "log_interval",
    "threads",
    "time.limit_minutes",
    "time.margin_seconds",
    "time.signal_seconds",
    "batch.micro",
    "layout.sequence_parallel",
    "layout.recompute",
    "layout.reshardable_checkpoints",
)


class SettingsChanged(ValueError):
    """A checkpoint folder trained with other weight-determining settings."""


def _flat(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key in sorted(value):
            _flat(f"{prefix}.{key}" if prefix else str(key), value[key], out)
    else:
        out[prefix] = value


def weight_settings(prepared, transformer_impl: str | None = None) -> dict[str, Any]:
    """The weight-determining settings of a prepared experiment, as flat dotted keys.

    ``transformer_impl``: Megatron's ``--transformer-impl`` on the planning cluster
    (megatron engine only; its checkpoints' parameter names depend on it)."""
    exp = prepared.experiment
    out: dict[str, Any] = {"engine": exp["engine"]}
    _flat("model", exp["model"], out)
    out["batch.global"] = prepared.layout.global_batch
    _flat("optim", exp["optim"], out)
    out["precision"] = exp["precision"]
    out["seed"] = exp["seed"]
    out["data.tokenizer"] = exp["data"]["tokenizer"]
    out["data.tokenizer_files"] = list(prepared.tokenizer_files)
    out["data.eod_token"] = prepared.eod_token
    out["data.split"] = exp["data"]["split"]
    out["data.blend"] = [
        [prefix, weight] for prefix, weight in zip(prepared.blend.prefixes, prepared.blend.weights)
    ]
    if exp["engine"] == "megatron":  # (TP, PP, DP: reshard.layout_settings)
        out["layout.distributed_optimizer"] = bool(exp["layout"].get("distributed_optimizer"))
        out["layout.transformer_impl"] = transformer_impl
    return out


def continuation_settings(prepared) -> dict[str, Any]:
    """The settings a campaign may change and continue with (recorded, not compared)."""
    exp = prepared.experiment
    flat: dict[str, Any] = {}
    _flat("", exp, flat)
    out = {key: flat.get(key) for key in _CONTINUATION}
    if exp["engine"] == "torch":
        out["layout.nodes"] = exp["layout"]["nodes"]
        out["layout.procs_per_node"] = exp["layout"]["procs_per_node"]
    return out


def data_settings(prepared) -> dict[str, Any]:
    """What the dataset index cache is built from, besides the sample counts (which grow
    with the campaign: a longer campaign keeps the cache, see docs/training.md)."""
    exp = prepared.experiment
    weights = weight_settings(prepared)
    out = {key: weights[key] for key in weights if key.startswith("data.")}
    out.update(engine=exp["engine"], seed=exp["seed"], seq_length=exp["model"]["seq_length"])
    return out


def param_text(settings: dict[str, Any]) -> str:
    """The settings as Snakemake params: one ``key=value`` line each, sorted (stable)."""
    return "\n".join(f"{key}={json.dumps(settings[key])}" for key in sorted(settings))


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for every key that differs (missing on one side: ``unset``)."""
    out = []
    for key in sorted(set(recorded) | set(current)):
        old, new = recorded.get(key, "unset"), current.get(key, "unset")
        if _canonical(old) != _canonical(new):
            out.append(f"{key}: {json.dumps(old)} -> {json.dumps(new)}")
    return out


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def settings_path(save: str | os.PathLike) -> Path:
    return Path(save) / SETTINGS_FILE


def load_recorded(save: str | os.PathLike) -> dict[str, Any] | None:
    """The settings the checkpoint folder records, or None when it records none."""
    path = settings_path(save)
    if not path.is_file():
        return None
    try:
        recorded = json.loads(path.read_text())
        weights = recorded["weights"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SettingsChanged(
            f"{path}: not a settings record ({e}); it records what the checkpoints in "
            f"{Path(save)} were trained with. Restore it, or start that experiment afresh "
            "(see docs/training.md, 'Changing an experiment')."
        ) from None
    if not isinstance(weights, dict):
        raise SettingsChanged(f"{path}: 'weights' is not a mapping; restore the file")
    if "layout" not in recorded and "layout.tp" in weights:
        # Recorded before the layout had its own section: TP/PP/DP were weights, and the
        # distributed optimizer (where it ran) saved in Megatron's default format.
        from hpcllm.training.plan import reshard

        layout = {key: weights.pop(key) for key in ("layout.tp", "layout.pp", "layout.dp")}
        ran = weights.get("layout.distributed_optimizer") and (
            weights.get("layout.transformer_impl") != "local"
        )
        layout["layout.checkpoint_format"] = (
            reshard.DP_ONLY if ran else reshard.NO_DISTRIBUTED_OPTIMIZER
        )
        recorded["layout"] = layout
    return recorded


def write_settings(
    save: str | os.PathLike, weights: dict, continuation: dict, layout: dict | None = None
) -> None:
    """``layout``: what the checkpoints are sharded by (reshard.layout_settings; megatron)."""
    path = settings_path(save)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"weights": weights, "continuation": continuation, "written": time.time()}
    if layout:
        record["layout"] = layout
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def refusal_message(
    name: str, save: str | os.PathLike, changed: list[str], planning: bool = False
) -> str:
    keys = "; ".join(changed)
    outcome = (
        "its segments are planned again, and the first one to run will refuse to start"
        if planning
        else "nothing was started"
    )
    return (
        f"training.experiments.{name}: the checkpoints in {save} were trained with other "
        f"settings ({keys}; recorded in {settings_path(save)}). Resuming would train a "
        f"model neither setting describes, so {outcome}. Either give the changed "
        "experiment a new name (training.experiments.<new name>), or restart it from "
        f"scratch with `hpcllm restart-training {name}` (in the workflow's directory, "
        f"or -d <it>), which moves the contents of {save} aside to "
        f"{save}.replaced-<time> (delete that yourself once it is not needed), then rerun."
    )


def layout_message(name: str, save: str | os.PathLike, reason: str, planning: bool = False) -> str:
    """A layout change Megatron cannot load (reshard.layout_refusal's ``reason``)."""
    outcome = "a run submits nothing (a dry run warns)" if planning else "nothing was started"
    return (
        f"training.experiments.{name}: the checkpoints in {save} were {reason} (recorded "
        f"in {settings_path(save)}); so {outcome}. To restart: `hpcllm restart-training "
        f"{name}` (moves the checkpoints aside, see docs/training.md, 'Changing an "
        "experiment'), or give the changed experiment a new name."
    )


def check_checkpoint_settings(
    name: str,
    save: str | os.PathLike,
    weights: dict[str, Any],
    continuation: dict[str, Any],
    has_checkpoint: bool,
    layout: dict[str, Any] | None = None,
) -> None:
    """Before a segment's engine starts: the checkpoint folder may be resumed with these
    settings (recorded then, with any change of continuation-safe ones), or refuse with
    :class:`SettingsChanged` naming the keys that differ and the ways out. ``layout``
    (reshard.layout_settings, megatron): a change of it is refused where Megatron cannot
    load the saved checkpoint with it; recorded with the weaker of the two formats until
    the segment has saved (:func:`record_saved_layout`)."""
    from hpcllm.training.plan import reshard

    recorded = load_recorded(save)
    if recorded is None:
        if has_checkpoint:
            log.warning(
                "%s records no settings (its checkpoints predate the record): recording the "
                "current ones; they are not checked against what was trained so far",
                save,
            )
        write_settings(save, weights, continuation, layout)
        return
    changed = differences(recorded["weights"], weights)
    if changed and has_checkpoint:
        raise SettingsChanged(refusal_message(name, save, changed))
    saved = recorded.get("layout") or {}
    new_layout = dict(layout or {})
    if has_checkpoint and saved and new_layout:
        reason = reshard.layout_refusal(saved, new_layout)
        if reason:
            raise SettingsChanged(layout_message(name, save, reason))
        key = "layout.checkpoint_format"  # the newest checkpoint is in either until a save
        new_layout[key] = reshard.weakest(saved.get(key), new_layout.get(key))
    moved = (
        changed
        + differences(recorded.get("continuation", {}), continuation)
        + differences(saved, new_layout)
    )
    if moved:
        log.info("%s: recording changed settings: %s", save, "; ".join(moved))
        write_settings(save, weights, continuation, new_layout)


def record_saved_layout(save: str | os.PathLike, layout: dict[str, Any]) -> None:
    """After a segment's engine saved a checkpoint: the layout and format it saved with."""
    recorded = load_recorded(save)
    if recorded is None or not layout or recorded.get("layout") == layout:
        return
    write_settings(save, recorded["weights"], recorded.get("continuation", {}), layout)


def restart_training(save: str | os.PathLike) -> Path | None:
    """Move the contents of a checkpoint folder aside (never delete them), so that the
    experiment trains from scratch; refused while a live job writes it (its lease).
    Returns the folder they went to, or None when there was nothing to move."""
    from hpcllm.training.checkpoints import lease

    save = Path(save)
    if not save.is_dir() or not any(not p.name.startswith(LEASE) for p in save.iterdir()):
        return None
    aside = Path(f"{save}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
    with lease.held(save):  # LeaseHeld (naming the job) while a segment writes it
        aside.mkdir()
        for entry in sorted(save.iterdir()):
            if not entry.name.startswith(LEASE):  # the lease and its lock stay
                shutil.move(str(entry), str(aside / entry.name))
    return aside


def plan_warning(
    name: str,
    save: str | os.PathLike,
    weights: dict[str, Any],
    layout: dict[str, Any] | None = None,
) -> str | None:
    """At plan time: why the segments will refuse the checkpoint folder (the
    weight-determining keys that differ from its record, or a ``layout`` that Megatron
    cannot load it with: reshard.layout_refusal), or None (no checkpoint, no record, or
    settings it resumes with)."""
    return _plan_refusal(name, save, weights, layout)[1]


def layout_plan_refusal(
    name: str, save: str | os.PathLike, weights: dict[str, Any], layout: dict[str, Any]
) -> str | None:
    """:func:`plan_warning` where it is a layout that Megatron cannot load the checkpoints
    with (a real run then submits nothing: the workflow's plan hook), else None."""
    kind, message = _plan_refusal(name, save, weights, layout)
    return message if kind == "layout" else None


def _plan_refusal(name, save, weights, layout) -> tuple[str | None, str | None]:
    from hpcllm.training.checkpoints.tracker import CheckpointError, latest_iteration
    from hpcllm.training.plan import reshard

    try:
        if latest_iteration(save) is None:
            return None, None  # nothing trained: the segment records the new settings
    except CheckpointError:
        pass  # the segment names that problem; the settings are compared all the same
    try:
        recorded = load_recorded(save)
    except SettingsChanged as e:
        return "settings", str(e)
    if recorded is None:
        return None, None
    changed = differences(recorded["weights"], weights)
    if changed:
        return "settings", refusal_message(name, save, changed, planning=True)
    reason = reshard.layout_refusal(recorded.get("layout") or {}, layout or {})
    if reason:
        return "layout", layout_message(name, save, reason, planning=True)
    return None, None
