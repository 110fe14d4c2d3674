"""Checksums of committed checkpoints, recorded at commit and verified before a resume.

A damaged checkpoint file of the same size (flipped bytes inside a tensor) loads without
complaint, and a resume would train on damaged weights. Each committed ``iter_*`` folder
gets a manifest, ``iter_*/hpcllm_checksums.json``: the size and XXH3-128 digest of every
file in it (xxhash: a checksum against damage, not against an adversary, at memory speed;
``benchmarks/checkpoint_checksum.py`` measures it against the save).

Engine-independent: the segment wrapper records the manifest of the committed iteration
(the tracker's) before it launches an engine, while it runs and after it exits, so that
Megatron-LM's folders (``torch_dist``: ``*.distcp``, ``.metadata``, ``common.pt``, ...)
are covered as much as the torch engine's ``mp_rank_00/model_optim_rng.pt``; the torch
engine also writes it itself, inside the folder before the commit. Before a resume the
wrapper verifies the committed iteration; a mismatch names the file and the newest older
checkpoint that still verifies.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from hpcllm.atomic import atomic_path
from hpcllm.training.checkpoints import tracker as checkpoints
from hpcllm.training.checkpoints.tracker import CheckpointError

log = logging.getLogger(__name__)

MANIFEST = "hpcllm_checksums.json"
ALGORITHM = "xxh3_128"
_CHUNK = 8 << 20  # 8 MiB reads: large enough for full speed, small enough for memory


def file_digest(path: str | os.PathLike) -> str:
    import xxhash  # here: the torch engine runs in images that may lack it

    h = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    """Every file of a checkpoint folder but the manifest, in a stable order."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(MANIFEST))


def write_manifest(folder: str | os.PathLike) -> Path:
    """Hash every file of ``folder`` (an ``iter_*`` folder, or its temporary twin) into its
    manifest."""
    folder = Path(folder)
    files = {
        p.relative_to(folder).as_posix(): {"size": p.stat().st_size, ALGORITHM: file_digest(p)}
        for p in _files(folder)
    }
    manifest = folder / MANIFEST
    with atomic_path(manifest) as tmp:
        tmp.write_text(json.dumps({"algorithm": ALGORITHM, "files": files}, indent=1) + "\n")
    return manifest


def has_manifest(save: str | os.PathLike, iteration: int) -> bool:
    return (checkpoints.iteration_dir(save, iteration) / MANIFEST).is_file()


def record_committed(save: str | os.PathLike) -> int | None:
    """Write the manifest of the committed iteration (the tracker's) if it has none;
    returns that iteration when it recorded one.

    Only the tracker's iteration: an engine writes it completely before the tracker names
    it, while an older folder without a manifest may be a leftover of a killed save."""
    if not Path(save, checkpoints.TRACKER).is_file():
        return None
    iteration = checkpoints.latest_iteration(save)
    if iteration is None or has_manifest(save, iteration):
        return None
    write_manifest(checkpoints.iteration_dir(save, iteration))
    return iteration


def drop_uncommitted(save: str | os.PathLike) -> list[int]:
    """Remove the manifests of ``iter_*`` folders above the committed iteration (a tracker
    pointed back at an older checkpoint): the engine writes those iterations again, and a
    manifest of the old contents would call the new ones damaged. Call it only while no
    engine writes ``save``."""
    committed = checkpoints.latest_iteration(save) or 0
    dropped = []
    for iteration in checkpoints.iteration_dirs(save):
        manifest = checkpoints.iteration_dir(save, iteration) / MANIFEST
        if iteration > committed and manifest.is_file():
            manifest.unlink()
            dropped.append(iteration)
    return dropped


def problem(folder: str | os.PathLike) -> str | None:
    """What is wrong with ``folder`` against its manifest (the first damaged or missing
    file), or None when every file verifies. A folder without a manifest is not checked."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        entries = manifest["files"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{folder / MANIFEST}: unreadable ({type(e).__name__}: {e})"
    for name, entry in entries.items():
        path = folder / name
        if not path.is_file():
            return f"{path}: missing (recorded when the checkpoint was committed)"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{path}: {size} bytes, {entry['size']} when the checkpoint was committed"
        digest = file_digest(path)
        if digest != entry[ALGORITHM]:
            return (
                f"{path}: damaged, its contents differ from those committed ({ALGORITHM} "
                f"{digest}, recorded {entry[ALGORITHM]}; same size)"
            )
    return None


def verify_committed(save: str | os.PathLike) -> int | None:
    """Before a resume: the committed iteration's files match its manifest. Returns that
    iteration (None for a fresh start); raises :class:`CheckpointError` naming the damaged
    file and the newest older checkpoint that verifies."""
    iteration = checkpoints.latest_iteration(save)
    if iteration is None:
        return None
    found = problem(checkpoints.iteration_dir(save, iteration))
    if found is None:
        return iteration
    tracker = Path(save) / checkpoints.TRACKER
    damaged = checkpoints.iteration_dir(save, iteration)
    older = [i for i in checkpoints.iteration_dirs(save) if i < iteration]
    fallback = next(
        (
            i
            for i in reversed(older)
            if has_manifest(save, i) and problem(checkpoints.iteration_dir(save, i)) is None
        ),
        None,
    )
    if fallback is None:
        way_out = (
            f"No older checkpoint in {save} verifies; train from scratch (`hpcllm "
            "restart-training <experiment>` moves the folder aside)."
        )
    else:
        way_out = (
            f"The previous committed checkpoint, iteration {fallback}, verifies: resume from "
            f"it with `rm -r {damaged} && echo {fallback} > {tracker}`, then rerun."
        )
    raise CheckpointError(
        f"{found}. Resuming iteration {iteration} would train on damaged weights. {way_out}"
    )


def check_checksums(save: str) -> None:
    """Before an engine starts: the committed checkpoint is what was committed (the
    manifest above); CheckpointError naming the damaged file if not."""
    dropped = drop_uncommitted(save)
    if dropped:
        log.info("%s: dropped the checksums of uncommitted iterations %s", save, dropped)
    recorded = record_committed(save)
    if recorded is not None:
        log.warning(
            "%s: iteration %d has no recorded checksums (written without them, or its job "
            "ended before it recorded them): recorded now, so not verified this once",
            save,
            recorded,
        )
    iteration = verify_committed(save)
    if iteration:
        log.info("%s: iteration %d verified against its checksums", save, iteration)


def record_checksums(save: str) -> None:
    """The committed checkpoint's checksums, if the engine wrote none (Megatron-LM)."""
    iteration = record_committed(save)
    if iteration is not None:
        log.info("%s: recorded the checksums of iteration %d", save, iteration)
