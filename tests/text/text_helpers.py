"""Helpers of the text tests."""

from __future__ import annotations

import json
from pathlib import Path

from support import small_file_system  # noqa: F401  (the text tests import it from here)


def write_jsonl(path: Path, records: list, raw_lines: dict[int, bytes] | None = None) -> Path:
    """Write records as JSONL; ``raw_lines`` puts raw bytes at given 1-based line numbers."""
    lines = [json.dumps(r, ensure_ascii=False).encode() for r in records]
    for lineno, raw in (raw_lines or {}).items():
        lines.insert(lineno - 1, raw)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path
