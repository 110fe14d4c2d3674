"""Megatron-LM's checkpoint directory layout, shared by both engines.

::

    <save>/latest_checkpointed_iteration.txt   the iteration of the newest complete checkpoint
    <save>/iter_0000100/mp_rank_00/model_optim_rng.pt

The tracker file is written last and atomically (temporary name, then rename): it is the
commit marker. An ``iter_*`` directory is itself written under a temporary name and renamed
when complete, so neither a killed save nor a stray directory can pass for a checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from hpcllm.atomic import atomic_path, temporary_path

TRACKER = "latest_checkpointed_iteration.txt"
# The manifest of a committed folder's checksums (hpcllm.training.checkpoints.checksums):
# its presence marks a folder that was complete when committed.
CHECKSUMS = "hpcllm_checksums.json"
# Where a campaign keeps its segment records and chain files, beside its checkpoints.
CHAIN = "chain"
_ITER_DIR = re.compile(r"^iter_(\d{7})$")


class CheckpointError(ValueError):
    """A checkpoint directory that is corrupt or partial; the message says what to do."""


def iteration_dir(save: str | os.PathLike, iteration: int) -> Path:
    return Path(save) / f"iter_{iteration:07d}"


def model_file(save: str | os.PathLike, iteration: int, rank_dir: str = "mp_rank_00") -> Path:
    return iteration_dir(save, iteration) / rank_dir / "model_optim_rng.pt"


def iteration_dirs(save: str | os.PathLike) -> list[int]:
    """Iterations that have an ``iter_*`` directory (complete or not), sorted."""
    save = Path(save)
    if not save.is_dir():
        return []
    found = (_ITER_DIR.match(p.name) for p in save.iterdir() if p.is_dir())
    return sorted(int(m.group(1)) for m in found if m)


def latest_iteration(save: str | os.PathLike) -> int | None:
    """The iteration of the newest complete checkpoint, or None for a fresh start.

    A directory with ``iter_*`` checkpoints but no tracker, a tracker that is not an
    iteration number, or a tracker that names a missing directory is an error: loading
    anything from it could silently restart training or load a half-written state.
    """
    save = Path(save)
    tracker = save / TRACKER
    if not tracker.exists():
        iters = iteration_dirs(save)
        if iters:
            raise CheckpointError(
                f"{save}: has checkpoint directories ({', '.join(f'iter_{i:07d}' for i in iters)}) "
                f"but no {TRACKER}, so none of them is known to be complete. {way_back(save)}"
            )
        return None
    text = tracker.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(
            f"{tracker}: holds {text!r}, not an iteration number. {way_back(save)}"
        )
    iteration = int(text)
    path = iteration_dir(save, iteration)
    if not path.is_dir():
        raise CheckpointError(
            f"{tracker}: points at iteration {iteration}, but {path} does not exist. "
            + way_back(save)
        )
    return iteration


def way_back(save: str | os.PathLike) -> str:
    """How to point a broken tracker at the newest complete checkpoint: the newest folder
    with its checksums (the next segment verifies it before it resumes), else the user's
    own judgement of the newest folder, else a fresh start."""
    tracker = Path(save) / TRACKER
    iters = iteration_dirs(save)
    complete = [i for i in iters if (iteration_dir(save, i) / CHECKSUMS).is_file()]
    if complete:
        return (
            f"The newest complete checkpoint (with its checksums) is iteration "
            f"{complete[-1]}: `echo {complete[-1]} > {tracker}` (the next segment verifies "
            "its files before it resumes), then rerun."
        )
    if iters:
        return (
            f"No iter_* folder has its checksums to show it is complete: if you know the "
            f"newest, iteration {iters[-1]}, is, `echo {iters[-1]} > {tracker}`; otherwise "
            "`hpcllm restart-training <experiment>` moves the folder aside to train afresh."
        )
    return f"`hpcllm restart-training <experiment>` moves {save} aside to train afresh."


def write_tracker(save: str | os.PathLike, iteration: int) -> None:
    """Commit a checkpoint: atomically point the tracker at ``iteration``."""
    tracker = Path(save) / TRACKER
    with atomic_path(tracker) as tmp:
        with open(tmp, "w") as f:
            f.write(f"{iteration}\n")
            f.flush()
            os.fsync(f.fileno())


def begin_iteration_dir(save: str | os.PathLike, iteration: int) -> Path:
    """A fresh temporary directory to write checkpoint ``iteration`` into."""
    tmp = temporary_path(iteration_dir(save, iteration))
    if tmp.exists():
        shutil.rmtree(tmp)  # leftover of a save that was killed
    tmp.mkdir(parents=True)
    return tmp


def finish_iteration_dir(save: str | os.PathLike, iteration: int) -> None:
    """Rename the temporary directory into place, then commit it in the tracker."""
    final = iteration_dir(save, iteration)
    tmp = temporary_path(final)
    if final.exists():
        shutil.rmtree(final)  # an uncommitted directory of the same iteration
    os.replace(tmp, final)
    write_tracker(save, iteration)


DELETING = ".deleting"  # an iter_* directory renamed for deletion (one step, then rmtree)


def prune(save: str | os.PathLike, keep_last: int, keep_every: int | None = None) -> list[int]:
    """Delete committed checkpoints beyond the newest ``keep_last`` (iterations that are a
    multiple of ``keep_every`` are kept for good); returns the iterations deleted.

    Only iterations below the one the tracker names are candidates: never the committed
    checkpoint, never one being written (above it, or under a temporary name). Each is first
    renamed out of the ``iter_*`` namespace in one step, then removed, so a kill at any
    point leaves the tracker's checkpoint loadable and no half-deleted ``iter_*``; a
    leftover ``*.deleting`` directory is removed by the next call."""
    save = Path(save)
    for leftover in save.glob(f"iter_*{DELETING}") if save.is_dir() else []:
        shutil.rmtree(leftover, ignore_errors=True)
    committed = latest_iteration(save)
    if committed is None:
        return []
    older = [i for i in iteration_dirs(save) if i < committed]
    keep = set(older[-(keep_last - 1) :]) if keep_last > 1 else set()
    if keep_every:
        keep |= {i for i in older if i % keep_every == 0}
    deleted = []
    for iteration in older:
        if iteration in keep:
            continue
        path = iteration_dir(save, iteration)
        doomed = path.with_name(path.name + DELETING)
        os.replace(path, doomed)
        shutil.rmtree(doomed)
        deleted.append(iteration)
    return deleted


def newest_kept_record(save: str | os.PathLike, key: str) -> dict[str, Any] | None:
    """The newest segment record kept in the checkpoint folder (``chain/seg<k>.json``,
    hpcllm.training.campaign.records) with a number under ``key``, with its ``segment``;
    None before one (unreadable records are passed over)."""
    newest = None
    for path in Path(save, CHAIN).glob("seg*.json"):
        try:
            record = json.loads(path.read_text())
            segment = int(path.stem.removeprefix("seg"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get(key), (int, float)):
            if newest is None or segment > newest["segment"]:
                newest = {**record, "segment": segment}
    return newest
