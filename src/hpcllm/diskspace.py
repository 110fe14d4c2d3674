"""A full disk (or quota) said in words: the file, the file system, its free space, what
the job needs where that is known, and what to do.

``OSError: [Errno 28] No space left on device`` names neither the file (a ``write``
fails without one) nor the file system; :class:`DiskFull` does. Raised by
``hpcllm.atomic`` (which knows the files being written and how much of them was written)
and by :func:`ensure_space` before a write whose size is known (a merge); ``hpcllm.logs``
turns any other ENOSPC into one.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(OSError):
    """A write that found no room; the message names the place, the space and the fix."""

    def __init__(self, message: str, code: int = errno.ENOSPC):
        super().__init__(code, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def is_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in FULL_ERRNOS


def size_text(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _existing(path: str | os.PathLike) -> Path:
    """``path`` or its nearest folder that exists (the file may be gone or not made yet)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def mount_point(path: str | os.PathLike) -> Path:
    p = _existing(path)
    while not os.path.ismount(p):
        p = p.parent
    return p


def describe(
    path: str | os.PathLike,
    *,
    needed: int | None = None,
    written: int | None = None,
    code: int = errno.ENOSPC,
) -> str:
    """The message for a write to ``path`` that found no room: ``needed`` is what the job
    needs in all where known, ``written`` what it wrote before the disk filled."""
    mount = mount_point(path)
    what = "disk quota exceeded" if code == errno.EDQUOT else "no space left on device"
    target = f"in {path}" if os.path.isdir(path) else str(path)  # the file is not known
    try:
        usage = shutil.disk_usage(_existing(path))
        space = f"has {size_text(usage.free)} free of {size_text(usage.total)}"
    except OSError as e:  # the message must not fail for want of a figure
        space = f"(its free space cannot be read: {e})"
    parts = [f"{what} writing {target}: the file system at {mount} {space}"]
    if needed is not None:
        parts.append(f"this step needs {size_text(needed)} there")
    elif written:
        parts.append(
            f"this step wrote {size_text(written)} before it filled (removed again), "
            "so it needs more than that"
        )
    room = (
        "raise the quota or free space in it (`quota`, or the site's tool, shows it)"
        if code == errno.EDQUOT
        else f"free space on {mount}"
    )
    return (
        "; ".join(parts)
        + f". Fix: {room}, or run the workflow from a folder on a file system with room "
        "(its data/, results/ and checkpoints/ are made there), then run the same command "
        "again: this step starts again."
    )


def from_oserror(
    exc: OSError, paths: Sequence[str | os.PathLike] = (), written: int | None = None
) -> DiskFull:
    """``exc`` (ENOSPC or EDQUOT) as :class:`DiskFull`, naming its file, else the first of
    ``paths`` (the files being written), else the working folder."""
    path = exc.filename or (paths[0] if paths else os.getcwd())
    return DiskFull(describe(path, written=written, code=exc.errno), exc.errno)


def ensure_space(path: str | os.PathLike, needed: int) -> None:
    """Raise :class:`DiskFull` before writing ``needed`` bytes to ``path`` where the file
    system has less free (a quota can still stop it later)."""
    if shutil.disk_usage(_existing(path)).free < needed:
        raise DiskFull(describe(path, needed=needed))
