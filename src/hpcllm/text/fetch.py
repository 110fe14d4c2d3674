"""Fetch a hub source's files into a mirror (``fetch_text``, on the login node).

Only for hub sources without a mirror: the repository's files that the chosen config
reads (its ``data_files`` in the dataset card, the source's own ``data_files``, or
OSCAR-2301's listed parts) plus the card, downloaded with ``huggingface_hub`` into
``<files>`` as they are on the hub, never re-encoded. Downloads resume where a killed
run stopped (``huggingface_hub``'s ``local_dir`` keeps partial files), and every file
is checked against the hub's metadata: its size, and its SHA-256 (LFS files, the data)
or git blob id (small files). The compute jobs then read the mirror in place. A gated
dataset's token is ``HF_TOKEN`` or the login, read by ``huggingface_hub`` itself: never
passed, printed or written here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from hpcllm.atomic import atomic_path
from hpcllm.diskspace import ensure_space
from hpcllm.progress import Progress
from hpcllm.text.hub_files import (
    OSCAR_2301,
    Repository,
    ScriptDataset,
    card_patterns,
    data_files,
    glob_match,
)
from hpcllm.text.sources import SourceError, check_hub_reachable, hub_unreachable

log = logging.getLogger(__name__)

CARD = "README.md"


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def _git_blob_id(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def verify(path: str, name: str, sibling: Any) -> dict[str, Any]:
    """Check a downloaded file against the hub's size and checksum; return them."""
    size = os.path.getsize(path)
    if sibling.size is not None and size != sibling.size:
        raise SourceError(
            f"{path}: {size} bytes, but the hub lists {name} with {sibling.size}; delete "
            "the file and rerun to fetch it again"
        )
    lfs = getattr(sibling, "lfs", None)
    if lfs:
        got, want, kind = _sha256(path), lfs.sha256, "sha256"
    else:
        got, want, kind = _git_blob_id(path), sibling.blob_id, "git blob id"
    if want and got != want:
        raise SourceError(
            f"{path}: {kind} {got} is not the hub's {want} for {name}; delete the file and "
            "rerun to fetch it again"
        )
    return {"size": size, kind.replace(" ", "_"): got}


# Where huggingface_hub (1.x, ``local_dir``) writes a file while it downloads it:
# ``<local_dir>/.cache/huggingface/download/<folder>/<hash>.<etag>.incomplete``. Its size
# is the progress inside a file; where a version writes elsewhere, progress is per file.
PARTIAL_GLOB = ".cache/huggingface/download/**/*.incomplete"
POLL_S = 5.0


def _partial_bytes(files_dir: str) -> int:
    from pathlib import Path

    return sum(_size(str(p)) for p in Path(files_dir).glob(PARTIAL_GLOB))


def _watch(progress: Progress, base: int, files_dir: str, stop: threading.Event) -> None:
    """Until ``stop``: the bytes done (``base``, plus the partial file's) every few s."""
    while not stop.wait(max(0.2, min(POLL_S, progress.interval))):
        progress.update((base + _partial_bytes(files_dir)) / 1e6)


def _fetch_with_progress(
    name: str,
    wanted: list[str],
    siblings: dict[str, Any],
    files_dir: str,
    get: Callable[[str, str], str],
) -> None:
    """Download ``wanted`` one after the other with progress: each file's line says which
    of how many it is; progress lines say the megabytes of all of them done (files there
    already count from the start, so the rate and the time left are the download's), the
    rate and the time left. While a file downloads, its partial file is measured every
    few seconds."""
    sizes = {f: siblings[f].size or 0 for f in wanted if f in siblings}
    there = sum(n for f, n in sizes.items() if _size(os.path.join(files_dir, f)) == n)
    progress = Progress(f"fetch_text {name}", sum(sizes.values()) / 1e6, "MB")
    progress.update(there / 1e6)  # the rate is measured from here on
    done = 0
    for k, filename in enumerate(wanted, 1):
        stop = threading.Event()
        watcher = threading.Thread(
            target=_watch, args=(progress, done, files_dir, stop), daemon=True
        )
        watcher.start()
        try:
            get(filename, f", file {k} of {len(wanted)}")
        finally:
            stop.set()
            watcher.join()
        done += sizes.get(filename, 0)
        progress.update(done / 1e6)
    progress.finish(done / 1e6)


def fetch_source(
    name: str, cfg: dict[str, Any], files_dir: str | os.PathLike, out_manifest: str | os.PathLike
) -> dict[str, Any]:
    """Download the files of hub source ``name`` that its config reads into
    ``files_dir`` (a mirror of the repository) and write a manifest of them."""
    from huggingface_hub import HfApi, hf_hub_download

    repo, files_dir = cfg["dataset"], str(files_dir)
    check_hub_reachable(name, cfg)
    start = time.monotonic()
    try:
        info = HfApi().dataset_info(repo, revision=cfg.get("revision"), files_metadata=True)
    except Exception as e:
        if {c.__name__ for c in type(e).__mro__} & {"ConnectionError", "ConnectError"}:
            raise SourceError(hub_unreachable(name, cfg, f"{type(e).__name__}: {e}")) from None
        raise
    siblings = {s.rfilename: s for s in info.siblings or []}
    fetched: dict[str, dict[str, Any]] = {}

    def get(filename: str, position: str = "") -> str:
        if filename not in fetched:
            if filename not in siblings:
                raise SourceError(
                    f"text.sources.{name}: {repo} has no file {filename} at revision {info.sha}"
                )
            path = hf_hub_download(
                repo, filename, repo_type="dataset", revision=info.sha, local_dir=files_dir
            )
            fetched[filename] = verify(path, filename, siblings[filename])
            size = f"{fetched[filename]['size']:,}"
            log.info("%s: %s (%s bytes) verified%s", name, filename, size, position)
        return os.path.join(files_dir, filename)

    class Hub(Repository):
        def files(self) -> list[str]:
            return sorted(siblings)

        def local_path(self, filename: str) -> str:
            return get(filename)

    if CARD in siblings:
        get(CARD)
    if cfg.get("data_files") or repo == OSCAR_2301:
        try:
            wanted = data_files(Hub(cfg, None))
        except ScriptDataset as e:
            raise SourceError(f"text.sources.{name}: {e}") from None
    else:
        card = open(get(CARD), encoding="utf-8").read() if CARD in siblings else ""
        patterns = card_patterns(card, cfg)
        if not patterns:
            raise SourceError(
                f"text.sources.{name}: the dataset card of {repo} names no data files for "
                f"config '{cfg.get('name') or 'default'}' and split "
                f"'{cfg.get('split', 'train')}'; set text.sources.{name}.data_files to their "
                "globs inside the repository (e.g. 'data/*.parquet')"
            )
        if cfg.get("data_dir"):
            patterns = [f"{cfg['data_dir'].rstrip('/')}/{p}" for p in patterns]
        wanted = [f for f in sorted(siblings) if any(glob_match(p, f) for p in patterns)]
        if not wanted:
            raise SourceError(
                f"text.sources.{name}: no file of {repo} matches {patterns} (the data files "
                f"of config '{cfg.get('name') or 'default'}' in its card)"
            )
    # The hub lists the sizes: a file system without room for what is left to download
    # fails now, not hours into it (a file already there counts; a partial download of a
    # killed run does not, so the check errs on the safe side by at most that much).
    ensure_space(
        files_dir,
        sum(
            max(0, (siblings[f].size or 0) - _size(os.path.join(files_dir, f)))
            for f in wanted
            if f not in fetched and f in siblings
        ),
    )
    _fetch_with_progress(name, wanted, siblings, files_dir, get)
    manifest = {
        "source": name,
        "dataset": repo,
        "revision": info.sha,
        "files": dict(sorted(fetched.items())),
        "bytes": sum(f["size"] for f in fetched.values()),
    }
    with atomic_path(out_manifest) as tmp:
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    log.info(
        "%s: %d files, %d bytes of %s@%s in %.1f s",
        name,
        len(fetched),
        manifest["bytes"],
        repo,
        info.sha,
        time.monotonic() - start,
    )
    return manifest
