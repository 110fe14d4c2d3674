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

import contextlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcllm.atomic import atomic_path
from hpcllm.training.checkpoints import tracker as checkpoints
from hpcllm.training.checkpoints.tracker import CheckpointError

log = logging.getLogger(__name__)

MANIFEST = checkpoints.CHECKSUMS
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


def read_manifest(folder: str | os.PathLike) -> dict[str, dict[str, Any]] | None:
    """The files a folder's manifest lists (name -> size and digest); None without a
    manifest. Raises :class:`CheckpointError` naming the manifest when it cannot be read
    or an entry lacks its size or digest."""
    manifest = Path(folder) / MANIFEST
    try:
        entries = json.loads(manifest.read_text())["files"]
        if not isinstance(entries, dict):
            raise TypeError(f"'files' is a {type(entries).__name__}, not a mapping")
        for name, entry in entries.items():
            if not isinstance(entry.get("size"), int) or not isinstance(entry.get(ALGORITHM), str):
                raise ValueError(f"the entry of {name} has no size or no {ALGORITHM} digest")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{manifest}: unreadable ({type(e).__name__}: {e})") from e
    return entries


def manifest_problem(folder: str | os.PathLike) -> str | None:
    """What is wrong with the manifest itself: unreadable, or listing no file (a
    checkpoint always has files, so an empty manifest would verify nothing)."""
    try:
        entries = read_manifest(folder)
    except CheckpointError as e:
        return str(e)
    if entries is not None and not entries:
        return f"{Path(folder) / MANIFEST}: lists no files, so it verifies none of them"
    return None


def _digest(path: Path, digests: dict[Path, str]) -> str:
    """``path``'s digest, read once per check however many references name it."""
    if path not in digests:
        digests[path] = file_digest(path)
    return digests[path]


def _mismatch(
    path: Path, entry: dict[str, Any], source: str, digests: dict[Path, str]
) -> str | None:
    """How ``path`` differs from ``entry`` (size, then digest), recorded in ``source``."""
    if not path.is_file():
        return f"{path}: missing ({source} lists it)"
    size = path.stat().st_size
    if size != entry["size"]:
        return f"{path}: {size} bytes, {entry['size']} in {source}"
    digest = _digest(path, digests)
    if digest != entry[ALGORITHM]:
        return (
            f"{path}: damaged, its contents differ from those in {source} ({ALGORITHM} "
            f"{digest}, recorded {entry[ALGORITHM]}; same size)"
        )
    return None


def problem(folder: str | os.PathLike) -> str | None:
    """What is wrong with ``folder`` against its manifest (the manifest itself, the first
    damaged or missing file, or a file it does not list), or None when every file
    verifies. A folder without a manifest is not checked."""
    folder = Path(folder)
    found = manifest_problem(folder)
    if found is not None:
        return found
    entries = read_manifest(folder)
    if entries is None:
        return None
    committed = "the manifest written when the checkpoint was committed"
    for name, entry in entries.items():
        found = _mismatch(folder / name, entry, committed, {})
        if found is not None:
            return found
    for path in _files(folder):
        if path.relative_to(folder).as_posix() not in entries:
            return f"{path}: not in {folder / MANIFEST} (added since, or the manifest edited)"
    return None


def _kept_records(save: str | os.PathLike) -> list[tuple[Path, dict[str, Any]]]:
    """The segment records a campaign keeps beside its checkpoints (``chain/seg<k>.json``,
    hpcllm.training.campaign.records) that can be read, newest segment first; the others
    are skipped."""
    found = []
    for path in Path(save, checkpoints.CHAIN).glob("seg*.json"):
        try:
            record = json.loads(path.read_text())
            segment = int(path.stem.removeprefix("seg"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            found.append((segment, path, record))
    return [(path, record) for _, path, record in sorted(found, reverse=True)]


# Keys of a segment record that only an hpcllm recording checksums writes: the data
# digest came a day after the checksums (2026-11-26), the record's own copy later.
_SINCE_CHECKSUMS = ("checkpoint_checksums", "data_digest")


def checksum_evidence(save: str | os.PathLike, iteration: int) -> str | None:
    """What shows that ``iteration`` of ``save`` was saved by an hpcllm that records
    checksums (so a missing manifest was lost, not never written), or None: it predates
    them. Another folder's manifest, or a segment record of such a version whose job
    resumed from an iteration below ``iteration`` (every checkpoint that job saved came
    after it resumed)."""
    with_manifest = [i for i in checkpoints.iteration_dirs(save) if has_manifest(save, i)]
    if with_manifest:
        return f"other checkpoints of {save} have theirs (iteration {with_manifest[-1]})"
    for path, record in _kept_records(save):
        resumed = record.get("resumed_from_iteration")
        if any(k in record for k in _SINCE_CHECKSUMS) and isinstance(resumed, int):
            if iteration > resumed:
                return (
                    f"the segment record {path} shows that the iterations after {resumed} "
                    "were saved by an hpcllm that records checksums"
                )
    return None


def records_checksums(save: str | os.PathLike) -> bool:
    """Whether this campaign's committed checkpoint should carry checksums
    (:func:`checksum_evidence`); otherwise they predate checksums."""
    iteration = checkpoints.latest_iteration(save)
    return iteration is not None and checksum_evidence(save, iteration) is not None


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


def _accept_hint(save: str | os.PathLike) -> str:
    return (
        f"If you know its files are intact: `hpcllm accept-checkpoint {save}` checks them "
        "against what it can (the segment records' checksums, the previous checkpoint), says "
        "what it could not check and records their checksums, then rerun"
    )


def verify_iteration(save: str | os.PathLike, iteration: int, reading: str) -> bool:
    """Before ``reading`` (e.g. "Resuming iteration 8 would train on") reads iteration
    ``iteration`` of ``save``: its files match its manifest (True), or the campaign's
    checkpoints predate checksums (False: nothing to verify against). Raises
    :class:`CheckpointError` naming the damaged file, the broken manifest, or the missing
    manifest where the campaign records them, with the newest older checkpoint that
    verifies."""
    folder = checkpoints.iteration_dir(save, iteration)
    if not (folder / MANIFEST).is_file():
        evidence = checksum_evidence(save, iteration)
        if evidence is None:
            return False
        raise CheckpointError(
            f"{folder}: committed without its checksums ({MANIFEST} is missing, while "
            f"{evidence}: it was deleted, or the job that saved it ended before recording "
            f"them), so its files cannot be verified. {reading} weights that may be "
            f"damaged. {_way_out(save, iteration)}. {_accept_hint(save)}"
        )
    broken = manifest_problem(folder)
    if broken is not None:
        raise CheckpointError(
            f"{broken}. {reading} weights it cannot verify. {_way_out(save, iteration)}. "
            + _accept_hint(save)
        )
    found = problem(folder)
    if found is not None:
        unlisted = f" not in {folder / MANIFEST}" in found
        raise CheckpointError(
            f"{found}. {reading} {'unverified' if unlisted else 'damaged'} weights. "
            f"{_way_out(save, iteration)}" + (f". {_accept_hint(save)}" if unlisted else "")
        )
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
            "%s: iteration %d predates checksums (no checkpoint here has them, no segment "
            "record of an hpcllm that records them covers it): recorded now, so it is not "
            "verified this once",
            save,
            iteration,
        )
        return
    log.info("%s: iteration %d verified against its checksums", save, iteration)


def record_fields(folder: str | os.PathLike) -> dict[str, Any]:
    """A segment record's copy of its checkpoint's checksums (``checkpoint_checksums``),
    kept apart from the folder: what ``accept-checkpoint`` compares a folder with once its
    manifest is lost. Empty where the folder has no readable manifest."""
    try:
        entries = read_manifest(folder)
    except CheckpointError:
        return {}
    return {"checkpoint_checksums": entries} if entries else {}


@dataclass
class Acceptance:
    """What ``accept-checkpoint`` could check of the committed iteration's files before it
    records their checksums: ``checked`` file -> what vouched for it, ``unchecked`` the
    files nothing recorded could, with what is known of them (a size beside the previous
    checkpoint's)."""

    save: Path
    iteration: int
    folder: Path
    checked: dict[str, str] = field(default_factory=dict)
    unchecked: dict[str, str] = field(default_factory=dict)
    replaces: str | None = None  # what is wrong with the manifest it rewrites

    def report(self) -> str:
        lines = [self.replaces or f"{self.folder / MANIFEST}: missing"]
        if not self.unchecked:
            lines.append(f"checked every file ({len(self.checked)}) against:")
        elif self.checked:
            lines.append(
                f"checked {len(self.checked)} of {len(self.checked) + len(self.unchecked)} files:"
            )
        sources: dict[str, list[str]] = {}
        for name, source in self.checked.items():
            sources.setdefault(source, []).append(name)
        lines += [f"  {source}: {', '.join(names)}" for source, names in sources.items()]
        if self.unchecked:
            lines.append(
                f"could not check {len(self.unchecked)} file(s) (no checksums of them are "
                "recorded anywhere else):"
            )
            lines += [
                f"  {name}{f' ({note})' if note else ''}" for name, note in self.unchecked.items()
            ]
        return "\n".join(lines)


def _references(save: Path, folder: Path, iteration: int) -> list[tuple[str, dict[str, Any]]]:
    """Checksums recorded of this very folder elsewhere: its own manifest where readable,
    the segment records kept for its iteration."""
    found = []
    own = None
    with contextlib.suppress(CheckpointError):  # a broken one: what is accepted over
        own = read_manifest(folder)
    if own:
        found.append((f"{folder / MANIFEST}", own))
    for path, record in _kept_records(save):
        entries = record.get("checkpoint_checksums")
        named = Path(str(record.get("checkpoint", ""))).name
        if isinstance(entries, dict) and entries and named == folder.name:
            found.append((f"the segment record {path}", entries))
    return found


def _previous_manifest(save: Path, iteration: int) -> tuple[int, dict[str, Any]] | None:
    """The newest older checkpoint with a readable manifest, and its files."""
    for older in reversed([i for i in checkpoints.iteration_dirs(save) if i < iteration]):
        with contextlib.suppress(CheckpointError):
            entries = read_manifest(checkpoints.iteration_dir(save, older))
            if entries:
                return older, entries
    return None


def check_acceptance(save: str | os.PathLike) -> Acceptance:
    """``hpcllm accept-checkpoint``, before it records anything: compare the committed
    iteration's files with every checksum recorded of them elsewhere (its own manifest
    where readable, the segment records kept for it) and, for files not covered, with the
    previous checkpoint's manifest (files that do not change between saves). Raises
    :class:`CheckpointError` naming a file that differs, or when the folder verifies
    already."""
    save = Path(save)
    iteration = checkpoints.latest_iteration(save)
    if iteration is None:
        raise CheckpointError(f"{save}: no committed checkpoint ({checkpoints.TRACKER})")
    folder = checkpoints.iteration_dir(save, iteration)
    acceptance = Acceptance(save, iteration, folder, replaces=problem(folder))
    if (folder / MANIFEST).is_file() and acceptance.replaces is None:
        raise CheckpointError(
            f"{folder}: has its checksums ({MANIFEST}) and its files verify against it; "
            "nothing to accept"
        )
    files = {p.relative_to(folder).as_posix(): p for p in _files(folder)}
    digests: dict[Path, str] = {}
    for source, entries in _references(save, folder, iteration):
        for name, entry in entries.items():
            found = _mismatch(folder / name, entry, source, digests)
            if found is not None:
                raise CheckpointError(
                    f"{found}. Not accepted: resuming would train on damaged weights. "
                    f"{_way_out(save, iteration)}"
                )
            acceptance.checked.setdefault(name, source)
    previous = _previous_manifest(save, iteration)
    for name, path in files.items():
        if name in acceptance.checked:
            continue
        twin = previous[1].get(name) if previous else None
        if twin is None:
            acceptance.unchecked[name] = ""
            continue
        size = path.stat().st_size
        if size == twin["size"] and _digest(path, digests) == twin[ALGORITHM]:
            acceptance.checked[name] = f"unchanged since iteration {previous[0]} (its manifest)"
        elif size == twin["size"]:
            acceptance.unchecked[name] = f"same size as in iteration {previous[0]}, other contents"
        else:
            acceptance.unchecked[name] = f"{size} bytes, {twin['size']} in iteration {previous[0]}"
    return acceptance


def record_accepted(acceptance: Acceptance) -> None:
    """Write the manifest of the accepted folder, its files as they are now."""
    write_manifest(acceptance.folder)


def record_checksums(save: str) -> None:
    """The committed checkpoint's checksums, if the engine wrote none (Megatron-LM)."""
    iteration = record_committed(save)
    if iteration is not None:
        log.info("%s: recorded the checksums of iteration %d", save, iteration)
