"""Open packed LMDBs read-only, once per process, and read their metadata (no torch here)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import lmdb

from hpcllm.vision.lmdb_pack import FORMAT, META_KEY, VERSION


def open_readonly(path: str | os.PathLike) -> lmdb.Environment:
    path = Path(path)
    if not (path / "data.mdb").is_file():
        raise FileNotFoundError(f"{path}: not an LMDB directory (no data.mdb); run pack_lmdb")
    return lmdb.open(
        str(path), readonly=True, lock=False, readahead=False, meminit=False, max_readers=512
    )


# One environment per LMDB and process: py-lmdb refuses to open the same files twice in a
# process, so every dataset over a path shares it. A forked DataLoader worker inherits the
# parent's entries; it closes them (its own mapping only) and opens its own.
_ENVIRONMENTS: dict[Path, tuple[int, int, lmdb.Environment]] = {}  # path: pid, inode, env


def shared_environment(
    path: str | os.PathLike, recheck: bool = False, resolved: bool = False
) -> lmdb.Environment:
    """This process's environment of ``path``. ``recheck``: reopen it if the LMDB was
    repacked (a new data.mdb) since; costs a stat, so not done for every record.
    ``resolved``: ``path`` is already absolute without symlinks (saves the lstat calls of
    resolving it on every record)."""
    key = Path(path) if resolved else Path(path).resolve()
    pid, inode, env = _ENVIRONMENTS.get(key, (None, None, None))
    if env is not None and pid == os.getpid():
        if not recheck or _inode(key) == inode:
            return env
    if env is not None:
        env.close()
    env = open_readonly(key)
    _ENVIRONMENTS[key] = (os.getpid(), _inode(key), env)
    return env


def _inode(lmdb_dir: Path) -> int:
    try:
        return (lmdb_dir / "data.mdb").stat().st_ino
    except FileNotFoundError:
        return -1


def close_environment(path: str | os.PathLike) -> None:
    """Close this process's environment of ``path`` (before deleting a staged copy: a
    mapping keeps a deleted file's space, on tmpfs the node's memory)."""
    _, _, env = _ENVIRONMENTS.pop(Path(path).resolve(), (None, None, None))
    if env is not None:
        env.close()


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The LMDB's metadata: ``num_samples``, ``classes`` and the rest (see lmdb_pack)."""
    with shared_environment(path, recheck=True).begin() as txn:
        raw = txn.get(META_KEY)
    if raw is None:
        raise ValueError(f"{path}: no {META_KEY.decode()} record; not written by pack_lmdb")
    meta = json.loads(raw)
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(
            f"{path}: format {meta.get('format')} version {meta.get('version')}, expected "
            f"{FORMAT} version {VERSION}; repack it"
        )
    return meta
