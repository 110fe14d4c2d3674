"""The engines' log: the Megatron-style iteration lines both engines print.

``iteration N/ T | consumed samples: ... | lm loss: ... |``: one per logged iteration,
read by the segment (how far it trained), its attempts, ``hpcllm status`` and the loss
curves.
"""

from __future__ import annotations

import os
import re
from typing import Any

_LOG_LINE = re.compile(r"iteration\s+(\d+)/\s*(\d+)\s*\|(.*)$")


def log_text_from(path: str | os.PathLike, offset: int = 0) -> str | None:
    """An engine log's text from byte ``offset`` on (one attempt's part of a log that
    every attempt appends to); None where it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return None


def parse_log_lines(text: str) -> list[dict[str, Any]]:
    """The fields of every Megatron-style iteration line (either engine)."""
    rows = []
    for line in text.splitlines():
        m = _LOG_LINE.search(line)
        if not m or not line.rstrip().endswith("|"):
            continue  # not one, or cut off (a killed job): Megatron ends them with "|"
        row: dict[str, Any] = {"iteration": int(m.group(1)), "train_iters": int(m.group(2))}
        for part in m.group(3).split("|"):
            key, sep, value = part.partition(":")
            if sep:
                try:
                    row[key.strip()] = float(value)
                except ValueError:
                    row[key.strip()] = value.strip()
        rows.append(row)
    return rows


# Megatron-LM's timer line (megatron/core/timers.py, ``--timing-log-option`` minmax or
# max): "    save-checkpoint ......: (min, max)" or "...: max", in milliseconds.
_SAVE_TIMER = re.compile(r"\bsave-checkpoint \.*: \(?(?:[\d.]+, )?([\d.]+)\)?")


def save_timer_line(milliseconds: float) -> str:
    """The timer lines as Megatron-LM prints them after a save (its minmax option)."""
    name = "save-checkpoint ".ljust(48, ".")
    return (
        f"(min, max) time across ranks (ms):\n    {name}: ({milliseconds:.2f}, {milliseconds:.2f})"
    )


def save_seconds(text: str) -> float | None:
    """The longest save an engine log reports, in seconds; None if it reports none."""
    found = [float(m.group(1)) / 1000 for m in _SAVE_TIMER.finditer(text)]
    return max(found) if found else None
