"""``hpcllm restart-training``: an experiment trains again from iteration 0.

Everything of the old model is moved aside, never deleted, under one time stamp:

- ``checkpoints/<exp>/`` (all but the lease) -> ``checkpoints/<exp>.replaced-<time>/``
- ``results/train/<exp>/`` (segment records, loss plot) -> ``results/train/<exp>.replaced-<time>/``
- ``logs/train_segment/<exp>/`` (engine logs, attempts) -> ``logs/train_segment/<exp>.replaced-<time>/``

The segment records must go too: Snakemake plans a segment only when its record is
missing (or its inputs or params changed), so with the records left in place the next run
would plan nothing but the plot. The logs must go so that ``hpcllm status`` and the loss
plot do not show the old model's losses and failures as the new one's.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from hpcllm.training.checkpoints import lease
from hpcllm.training.checkpoints.lease import LEASE


def _folders(workdir: Path, name: str) -> tuple[Path, Path, Path]:
    return (
        workdir / "checkpoints" / name,
        workdir / "results" / "train" / name,
        workdir / "logs" / "train_segment" / name,
    )


def _has_entries(folder: Path, keep: str = "\0") -> bool:
    return folder.is_dir() and any(not p.name.startswith(keep) for p in folder.iterdir())


def restart_training(workdir: str | os.PathLike, name: str) -> list[tuple[Path, Path]]:
    """Move the experiment's checkpoints, segment records and segment logs aside; refused
    (:class:`hpcllm.training.checkpoints.lease.LeaseHeld`, naming the job) while a live job
    writes the checkpoint folder. Returns the (folder, where its contents went) pairs; empty when
    there was nothing to move."""
    save, records, logs = _folders(Path(workdir), name)
    if not (_has_entries(save, keep=LEASE) or _has_entries(records) or _has_entries(logs)):
        return []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    n = 1
    while any(f.with_name(f"{name}.replaced-{stamp}").exists() for f in (save, records, logs)):
        n += 1  # a second restart within the same second
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{n}"
    moved = []
    # The lease: a segment writes its checkpoints, record and logs while it holds it.
    with lease.held(save):
        if _has_entries(save, keep=LEASE):
            aside = save.with_name(f"{name}.replaced-{stamp}")
            aside.mkdir()
            for entry in sorted(save.iterdir()):
                if not entry.name.startswith(LEASE):  # the lease and its lock stay
                    shutil.move(str(entry), str(aside / entry.name))
            moved.append((save, aside))
        for folder in (records, logs):
            if _has_entries(folder):
                aside = folder.with_name(f"{name}.replaced-{stamp}")
                folder.rename(aside)
                moved.append((folder, aside))
    return moved
