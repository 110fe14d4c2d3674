"""Helpers of the text tests."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def write_jsonl(path: Path, records: list, raw_lines: dict[int, bytes] | None = None) -> Path:
    """Write records as JSONL; ``raw_lines`` puts raw bytes at given 1-based line numbers."""
    lines = [json.dumps(r, ensure_ascii=False).encode() for r in records]
    for lineno, raw in (raw_lines or {}).items():
        lines.insert(lineno - 1, raw)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@contextlib.contextmanager
def small_file_system(path: Path, size: str) -> Iterator[Path]:
    """A real file system of ``size`` mounted at ``path`` (tmpfs: needs root, which the
    test suite has; skipped where mounting is refused). A file is left in it, so that
    Snakemake's clean-up of a failed job's empty folders does not try to remove it."""
    path.mkdir(parents=True, exist_ok=True)
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs to fill ({mount.stderr.strip()}): needs root")
    try:
        (path / "mount-point").write_text("a small tmpfs of the test\n")
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)
