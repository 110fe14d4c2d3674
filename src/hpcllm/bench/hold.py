"""Holding back the larger points of a series after a failure of the network or at start-up.

A series is the points of one experiment, model, scaling mode and precision; their node
counts double (:mod:`hpcllm.bench.sweeps`). A wrong rendezvous host, an interface NCCL
cannot use or a broken fabric fails every multi-node point the same way, each at its own
cost in GPU-hours, and a failed point is a result, not a reason to stop the sweep. So when
a point's job starts it first looks at the records of the smaller points of its series:
if one failed in a way that every larger point would meet, the point is *held*: its
engine is not started, its record says ``held`` and names that point, its failure class
and its log, and the job ends within seconds, successfully.

The rules run each point after the smaller ones of its series (so that their records are
there to look at) and rerun a held point when the point that holds it reruns
(``bench_after`` in workflow/rules/benchmarks_functions.smk): rerunning the failed point
releases the points it held, and nothing else reruns.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from hpcllm.atomic import atomic_paths

log = logging.getLogger(__name__)

HELD = "held"
# Failures of the network: whenever in the run they happened, a larger point, with more
# nodes to connect, meets them too.
NETWORK_FAILURES = frozenset({"nccl_error"})
# Failures that hold when the run never logged a training iteration: processes that did
# not meet (rendezvous_error), a start-up that hung until the time limit, an error no
# class names (a launcher, a container runtime or a fabric plugin that failed). The other
# classes hold nothing: out of memory, a refused configuration or a missing file say
# something about that point, a node failure, a signal, a preemption or a cancellation
# about that moment.
START_UP_FAILURES = frozenset({"rendezvous_error", "time_limit", "error"})


def series_key(point: dict) -> tuple:
    return tuple(point[k] for k in ("benchmark", "experiment", "model", "scaling", "precision"))


def smaller_in_series(point: dict) -> list[tuple[int, str]]:
    """(nodes, id) of the smaller points of the point's series, smallest first (whether
    the plan has them or not: the planner leaves out points that cannot fit)."""
    from hpcllm.bench.sweeps import node_counts, point_id

    return [
        (n, point_id(point["experiment"], point["model"], point["scaling"], point["precision"], n))
        for n in node_counts(point["min_nodes"], point["nodes"])
        if n < point["nodes"]
    ]


def smaller_points(points: Iterable[dict]) -> dict[str, list[str]]:
    """Point id -> the ids of the smaller points of its series among ``points``."""
    series: dict[tuple, list[dict]] = {}
    for point in points:
        series.setdefault(series_key(point), []).append(point)
    smaller = {}
    for members in series.values():
        members.sort(key=lambda p: p["nodes"])
        for i, point in enumerate(members):
            smaller[point["id"]] = [p["id"] for p in members[:i]]
    return smaller


def reached_training(benchmark: str, log_path: str | Path) -> bool:
    """Whether the run's log holds a training iteration (language) or batch (vision)."""
    from hpcllm.bench.logparse import parse_megatron_log, parse_vision_log

    try:
        if benchmark == "language":
            return bool(parse_megatron_log(log_path).iterations)
        return bool(parse_vision_log(log_path).batches)
    except (OSError, ValueError):
        return False  # no log, or none to read: nothing shows the run got that far


def holds(benchmark: str, status: str | None, log_path: str | Path) -> bool:
    """Whether a run that ended with ``status`` holds the larger points of its series."""
    if status in NETWORK_FAILURES:
        return True
    return status in START_UP_FAILURES and not reached_training(benchmark, log_path)


def find_hold(point: dict, results: str | Path) -> dict | None:
    """The hold on ``point`` from the smallest point of its series below it whose record
    (in ``results``/<id>/run.json) holds, or None."""
    for nodes, other in smaller_in_series(point):
        folder = Path(results) / other
        try:
            record = json.loads((folder / "run.json").read_text())
        except (OSError, ValueError):
            continue  # not run (left out by the planner), or its record is not readable
        if holds(point["benchmark"], record.get("status"), folder / "run.log"):
            return {
                "held_by": other,
                "held_by_nodes": nodes,
                "held_by_status": record["status"],
                "held_by_log": str(folder / "run.log"),
            }
    return None


def nodes_text(nodes: int) -> str:
    return f"{nodes} node" if nodes == 1 else f"{nodes} nodes"


def hold_message(hold: dict, point: dict) -> str:
    """What the held point's log says: why it did not run, and how it will."""
    other_record = Path(hold["held_by_log"]).with_name("run.json")
    return (
        f"hpcllm: {point['id']} is held, its engine was not started: {hold['held_by']} "
        f"({nodes_text(hold['held_by_nodes'])}, the same series) failed with "
        f"{hold['held_by_status']}, which every larger point of the series would meet "
        f"(its log: {hold['held_by_log']}).\n"
        f"Rerun {hold['held_by']} once the cause is fixed (delete {other_record.parent}, or "
        f"snakemake --forcerun {other_record}): this point then runs after it.\n"
    )


def hold_if_failed_below(point: dict, log_path: str | Path, record_path: str | Path) -> dict | None:
    """Write ``point``'s log and record as held when a smaller point of its series failed
    in a way that holds (:func:`find_hold`), and return the record; else None (the
    point runs). The results folder is the one the point's own folder is in."""
    hold = find_hold(point, Path(record_path).parent.parent)
    if hold is None:
        return None
    record = {
        "id": point["id"],
        "status": HELD,
        **hold,
        "returncode": None,
        "wall_time_s": 0.0,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }
    with atomic_paths(log_path, record_path) as (tmp_log, tmp_record):
        Path(tmp_log).write_text(hold_message(hold, point))
        Path(tmp_record).write_text(json.dumps(record, indent=1) + "\n")
    log.warning("%s", hold_message(hold, point).strip())
    return record


def held_by(record_path: str | Path) -> str | None:
    """The point that holds this one, from its existing record; None if it is not held."""
    try:
        record = json.loads(Path(record_path).read_text())
    except (OSError, ValueError):
        return None
    return record.get("held_by") if record.get("status") == HELD else None
