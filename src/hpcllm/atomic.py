"""Write files under temporary names and rename them only when complete.

A job that is killed (time limit, node failure, scancel) then leaves ``*.incomplete``
files behind, never a file that Snakemake or a user could take for finished. The
temporary name is fixed, so a rerun overwrites the leftovers instead of piling them up.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from hpcllm.diskspace import DiskFull, from_oserror, is_full

SUFFIX = ".incomplete"


def temporary_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + SUFFIX)


@contextlib.contextmanager
def atomic_paths(*paths: str | os.PathLike) -> Iterator[tuple[Path, ...]]:
    """Yield temporary paths for ``paths``; rename them all on success, remove on error.

    The last path is renamed last, so a reader that checks it (an ``.idx``, a manifest)
    sees the others complete.
    """
    finals = [Path(p) for p in paths]
    temps = [temporary_path(p) for p in finals]
    for p in finals:
        p.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield tuple(temps)
    except BaseException as e:
        full = is_full(e) and not isinstance(e, DiskFull)
        written = {p: _size(t) for t, p in zip(temps, finals)} if full else {}
        for t in temps:
            with contextlib.suppress(FileNotFoundError):
                if t.is_dir():
                    shutil.rmtree(t)
                else:
                    t.unlink()
        if full:
            # Named after the file that was growing (a failed write names none), with the
            # free space now that the partial files are gone.
            by_temp = dict(zip(map(str, temps), finals))
            growing = max(finals, key=lambda p: written[p])
            e.filename = str(by_temp.get(str(e.filename), e.filename or growing))
            raise from_oserror(e, finals, sum(written.values())) from e
        raise
    for t, p in zip(temps, finals):
        if not t.exists():
            raise FileNotFoundError(f"{t} was not written; {p} is not complete")
        replace(t, p)


def _size(path: Path) -> int:
    """Bytes in a file or folder (0 when it is not there)."""
    try:
        if path.is_dir():
            return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        return path.stat().st_size
    except OSError:
        return 0


def replace(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``. ``os.replace`` cannot replace a non-empty directory
    (a repack outside Snakemake, which removes outputs first), so an existing directory
    is moved aside first and removed after: ``final`` is never a mix of both (it is
    briefly absent)."""
    if final.is_dir() and not final.is_symlink():
        old = final.with_name(final.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    with atomic_paths(path) as (tmp,):
        yield tmp
