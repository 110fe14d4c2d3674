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


def records_checksums(save: str | os.PathLike) -> bool:
    """Whether this campaign's checkpoints carry checksums (an ``iter_*`` folder of
    ``save`` has a manifest). Then a committed one without a manifest lost it, or its job
    ended before recording it: unverified. Otherwise they predate checksums."""
    return any(has_manifest(save, i) for i in checkpoints.iteration_dirs(save))


def _way_out(save: str | os.PathLike, iteration: int) -> str:
    """The newest older checkpoint that verifies, and how to resume from it."""
    tracker = Path(save) / checkpoints.TRACKER
    bad = checkpoints.iteration_dir(save, iteration)
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
        return (
            f"No older checkpoint in {save} verifies; train from scratch (`hpcllm "
            "restart-training <experiment>` moves the folder aside)"
        )
    return (
        f"The previous committed checkpoint, iteration {fallback}, verifies: resume from "
        f"it with `rm -r {bad} && echo {fallback} > {tracker}`, then rerun"
    )


def verify_iteration(save: str | os.PathLike, iteration: int, reading: str) -> bool:
    """Before ``reading`` (e.g. "Resuming iteration 8 would train on") reads iteration
    ``iteration`` of ``save``: its files match its manifest (True), or the campaign's checkpoints predate
    checksums (False: nothing to verify against). Raises :class:`CheckpointError` naming
    the damaged file, or the missing manifest where the campaign records them, with the
    newest older checkpoint that verifies."""
    folder = checkpoints.iteration_dir(save, iteration)
    if not (folder / MANIFEST).is_file():
        if not records_checksums(save):
            return False
        raise CheckpointError(
            f"{folder}: committed without its checksums ({MANIFEST} is missing, while other "
            f"checkpoints of {save} have theirs: it was deleted, or the job that saved it "
            f"ended before recording them), so its files cannot be verified. {reading} "
            f"weights that may be damaged. {_way_out(save, iteration)}. If you know its "
            f"files are intact: `hpcllm accept-checkpoint {save}` records their checksums "
            "as they are, then rerun"
        )
    found = problem(folder)
    if found is not None:
        raise CheckpointError(f"{found}. {reading} damaged weights. {_way_out(save, iteration)}")
    return True


def verify_committed(save: str | os.PathLike) -> int | None:
    """Before a resume: the committed iteration's files match its manifest. Returns that
    iteration (None for a fresh start); raises :class:`CheckpointError` naming the damaged
    file and the newest older checkpoint that verifies."""
    iteration = checkpoints.latest_iteration(save)
    if iteration is None:
        return None
    verify_iteration(save, iteration, f"Resuming iteration {iteration} would train on")
    return iteration


def check_checksums(save: str) -> None:
    """Before an engine starts: the committed checkpoint is what was committed (the
    manifest above); CheckpointError naming the damaged file, or the missing manifest, if
    not."""
    dropped = drop_uncommitted(save)
    if dropped:
        log.info("%s: dropped the checksums of uncommitted iterations %s", save, dropped)
    iteration = checkpoints.latest_iteration(save)
    if iteration is None:
        return
    if not verify_iteration(save, iteration, f"Resuming iteration {iteration} would train on"):
        record_committed(save)
        log.warning(
            "%s: iteration %d predates checksums (no checkpoint here has them): recorded "
            "now, so it is not verified this once",
            save,
            iteration,
        )
        return
    log.info("%s: iteration %d verified against its checksums", save, iteration)


def accept_committed(save: str | os.PathLike) -> int:
    """``hpcllm accept-checkpoint``: record the checksums of the committed iteration as
    its files are now (the user vouches for them); the iteration."""
    iteration = checkpoints.latest_iteration(save)
    if iteration is None:
        raise CheckpointError(f"{save}: no committed checkpoint ({checkpoints.TRACKER})")
    folder = checkpoints.iteration_dir(save, iteration)
    if (folder / MANIFEST).is_file():
        raise CheckpointError(
            f"{folder}: has its checksums already ({MANIFEST}); nothing to accept"
        )
    write_manifest(folder)
    return iteration


def record_checksums(save: str) -> None:
    """The committed checkpoint's checksums, if the engine wrote none (Megatron-LM)."""
    iteration = record_committed(save)
    if iteration is not None:
        log.info("%s: recorded the checksums of iteration %d", save, iteration)
