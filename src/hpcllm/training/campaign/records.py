"""A segment's result record is history: kept where Snakemake does not manage it.

Snakemake deletes a job's output before it runs the job again (``--forcerun``, a changed
param, a settings change the segment then refuses), so ``results/train/<exp>/seg<k>.json``
alone loses the record of the job that trained the segment. That job also keeps a copy in
the checkpoint folder, ``checkpoints/<exp>/chain/seg<k>.json`` (the folder where a chain
keeps its files; both modes share it, and a restart moves it aside with the checkpoints).
A later job that finds the segment trained already copies the kept record back; where none
was kept (checkpoints from before), it writes one that says it trained nothing.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from hpcllm.atomic import atomic_path
from hpcllm.training.checkpoints import tracker as checkpoints
from hpcllm.training.engines.log_lines import parse_log_lines
from hpcllm.training.plan.experiment import Paths, Prepared, target_iteration

log = logging.getLogger(__name__)

KEPT = checkpoints.CHAIN


def kept_path(save: str | os.PathLike, segment: int) -> Path:
    return Path(save) / KEPT / f"seg{segment}.json"


def _write(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_trained(record: dict[str, Any], paths: Paths) -> None:
    """Write the record of the job that trained the segment, and keep its copy."""
    text = json.dumps(record, indent=2) + "\n"
    _write(kept_path(paths.save, record["segment"]), text)
    _write(paths.record, text)


def kept(save: str | os.PathLike, segment: int, target: int) -> str | None:
    """The kept record of ``segment`` when it records the segment's target as it is now
    (a changed ``iterations_per_segment`` moves the target: that record is of another
    segment); None otherwise."""
    path = kept_path(save, segment)
    try:
        text = path.read_text()
        record = json.loads(text)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("last_iteration") != target:
        return None
    return text


def untrained(
    name: str,
    prepared: Prepared,
    segment: int,
    save: str,
    engine_log: str | os.PathLike,
    written_by: str,
) -> dict[str, Any]:
    """The record of a committed segment written without the job that trained it: what
    the checkpoint and the engine log show; no time, no resume point (unknown)."""
    exp = prepared.experiment
    stop = target_iteration(exp, segment)
    text = Path(engine_log).read_text(errors="replace") if Path(engine_log).is_file() else ""
    lines = [r for r in parse_log_lines(text) if r["iteration"] <= stop]
    return {
        "experiment": name,
        "engine": exp["engine"],
        "segment": segment,
        "segments": exp["segments"],
        "first_iteration": target_iteration(exp, segment - 1) + 1,
        "last_iteration": stop,
        "consumed_samples": stop * prepared.layout.global_batch,
        "lm_loss": lines[-1].get("lm loss") if lines else None,
        "gpus": prepared.layout.gpus,
        "checkpoint": str(checkpoints.iteration_dir(save, stop)),
        "trained_by_this_job": False,
        "written_by": written_by,
    }


def settled(name: str, prepared: Prepared, segment: int, paths: Paths, reached: int) -> dict:
    """Write the record of a segment whose target the checkpoint (at ``reached``) holds
    already: the kept record of the job that trained it, else one that says this job
    trained nothing. Never a record of its own: it trained nothing and measured nothing."""
    stop = target_iteration(prepared.experiment, segment)
    text = kept(paths.save, segment, stop)
    if text is not None:
        log.info("segment %d of %s: its record restored from %s", segment, name,
                 kept_path(paths.save, segment))  # fmt: skip
    else:
        record = untrained(
            name, prepared, segment, paths.save, paths.engine_log,
            f"a job that trained nothing: it found the checkpoint at iteration {reached}, "
            "at or past this segment's target, and no kept record of the job that trained it",
        )  # fmt: skip
        log.warning("segment %d of %s: no record of the job that trained it was kept; "
                    "written one that says so", segment, name)  # fmt: skip
        text = json.dumps(record, indent=2) + "\n"
    _write(paths.record, text)
    return json.loads(text)
