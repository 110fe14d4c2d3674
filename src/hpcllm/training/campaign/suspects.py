"""Suspect nodes of a campaign: every node a segment's next job was told to avoid, and
the nodes that came back to it, for the site's admins.

Two events make a node suspect: a hang whose suspect rank ran on it
(:func:`hpcllm.training.campaign.attempts.suspect`; the retry excludes it) and a
straggler beyond the cluster's factor (:mod:`hpcllm.training.campaign.stragglers`; the
next segment excludes it). Exclusion keeps one job off a node; it does not repair it,
and the next job may land on it again. A node suspected in two events is more than bad
luck (a slow GPU, a flaky link, a file system client that hangs): the site's admins can
test and drain it, the campaign cannot. ``hpcllm status`` and the segment's record name it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcllm.training.campaign import attempts


@dataclass(frozen=True)
class Event:
    node: str
    kind: str  # "hang" or "straggler"
    segment: int
    detail: str  # what the node's rank did: "1.93 x the median", "rank 1 in 'save' ..."
    job_id: str | None = None

    def short(self) -> str:
        return f"{self.kind} in segment {self.segment}"


def straggler_event(record: dict[str, Any], segment: int) -> Event | None:
    """The straggler a segment's record names beyond its threshold, as an event."""
    found = record.get("stragglers") if isinstance(record, dict) else None
    if not isinstance(found, dict) or not found.get("beyond"):
        return None
    slow = found.get("slowest") or {}
    if not slow.get("host"):
        return None
    detail = f"{slow.get('factor', 0):.2f} x the median"
    return Event(slow["host"], "straggler", segment, detail, record.get("job_id"))


def hang_events(entries: list[attempts.Attempt], segment: int) -> list[Event]:
    """The hangs among a segment's attempts (every run's) that name a node."""
    found = []
    for a in entries:
        first = attempts.suspect(a.hang) if a.failure == "hang" else None
        if first and first.get("host"):
            doing = f"rank {first['rank']} in '{first['phase']}' at iteration {first['iteration']}"
            found.append(Event(first["host"], "hang", segment, doing, a.job_id))
    return found


def events(
    records: str | Path, logs: str | Path, current: dict[str, Any] | None = None
) -> list[Event]:
    """Every suspect-node event of one experiment: the stragglers its segment records
    (``results/train/<experiment>/seg<k>.json``) name and the hangs its segments'
    attempts (``logs/train_segment/<experiment>/seg<k>.attempts.json``) name, in
    segment order. ``current``: a segment's record being written, instead of the file
    an earlier run may have left for that segment."""
    found: list[Event] = []
    for path in Path(logs).glob("seg*.attempts.json"):
        found += hang_events(attempts.load(path), _segment(path))
    kept = {_segment(p): p for p in Path(records).glob("seg*.json")}
    for segment, path in sorted(kept.items()):
        if current is not None and segment == current.get("segment"):
            continue
        try:
            event = straggler_event(json.loads(path.read_text()), segment)
        except (OSError, ValueError):
            continue
        if event:
            found.append(event)
    if current is not None:
        event = straggler_event(current, int(current.get("segment") or 0))
        found += [event] if event else []
    return sorted(found, key=lambda e: (e.segment, e.kind != "hang", e.node))


def suspects_line(found: list[Event]) -> str | None:
    """One line for status: each suspect node, why, kept off the job that followed."""
    if not found:
        return None
    named = "; ".join(f"{e.node} ({e.short()}, {e.detail})" for e in found)
    return f"suspect nodes, each excluded from the job after it: {named}"


def admin_reports(found: list[Event]) -> list[str]:
    """One line per node suspected in two events or more, naming them, for the site's
    admins (``node n2 was excluded twice (hang in segment 2, straggler in segment 4):
    report it to the site's admins``)."""
    by_node: dict[str, list[Event]] = {}
    for e in found:
        by_node.setdefault(e.node, []).append(e)
    lines = []
    for node, seen in by_node.items():
        if len(seen) < 2:
            continue
        times = "twice" if len(seen) == 2 else f"{len(seen)} times"
        what = ", ".join(e.short() for e in seen)
        lines.append(f"node {node} was excluded {times} ({what}): report it to the site's admins")
    return lines


def _segment(path: Path) -> int:
    match = re.match(r"seg(\d+)", path.name)
    return int(match.group(1)) if match else 0
