"""Stragglers: the rank whose compute per iteration is slowest, against the median of
all ranks, from the torch engine's heartbeats (``compute_seconds``:
:mod:`hpcllm.training.engines.compute_clock`). Every rank of a data-parallel job waits
for the slowest at each gradient all-reduce, so one slow node sets the whole job's pace.

A node whose rank is slower than the median by more than the cluster's
``watchdog.straggler_factor`` is named in the segment's record (``stragglers``), in
``hpcllm status``, and kept off the next segment's job (``--exclude``; the
``train_segment`` rule's slurm_extra; in a chain of jobs, the pending successor's
ExcNodeList: hpcllm.training.campaign.chain.exclude_in_successor). A node suspected twice
is reported for the site's admins (hpcllm.training.campaign.suspects).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any


def assess(beats: dict[int, dict[str, Any]], factor: float) -> dict[str, Any] | None:
    """From every rank's last heartbeat (rank -> fields): the median compute time, the
    slowest rank with its node and factor, and whether that is beyond ``factor``. None
    where fewer than two ranks measured one (nothing to compare)."""
    timed = {r: b for r, b in beats.items() if isinstance(b.get("compute_seconds"), (int, float))}
    if len(timed) < 2:
        return None
    median = statistics.median(b["compute_seconds"] for b in timed.values())
    rank, slow = max(timed.items(), key=lambda item: (item[1]["compute_seconds"], -item[0]))
    ratio = slow["compute_seconds"] / median if median > 0 else 1.0
    return {
        "median_compute_seconds": round(median, 6),
        "slowest": {
            "rank": rank,
            "host": slow.get("host"),
            "compute_seconds": slow["compute_seconds"],
            "factor": round(ratio, 3),
        },
        "threshold": factor,
        "beyond": ratio > factor,
        "ranks": len(timed),
    }


def describe(found: dict[str, Any] | None) -> str | None:
    """One line for status: the slowest node against the median, with its factor."""
    if not found:
        return None
    slow = found["slowest"]
    verdict = (
        f"beyond {found['threshold']:g}: excluded from the next segment"
        if found["beyond"]
        else f"within {found['threshold']:g}"
    )
    return (
        f"slowest node: {slow['host']} (rank {slow['rank']}) computes "
        f"{slow['compute_seconds']:.3g} s per iteration, {slow['factor']:.2f} x the median "
        f"{found['median_compute_seconds']:.3g} s of {found['ranks']} ranks ({verdict})"
    )


def nodes_to_exclude(record_path: str | Path) -> list[str]:
    """The straggler node a segment's record names beyond its threshold (for the next
    segment's --exclude); none where the record is missing or names none."""
    try:
        record = json.loads(Path(record_path).read_text())
    except (OSError, ValueError):
        return []
    found = record.get("stragglers") if isinstance(record, dict) else None
    if not isinstance(found, dict) or not found.get("beyond"):
        return []
    host = (found.get("slowest") or {}).get("host")
    return [host] if host else []
