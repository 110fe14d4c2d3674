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

The same look is taken on the login node when the point's job is submitted (Snakemake
sizes a job's resources again once its inputs, the smaller points' runs, are done): a
point that will be held asks for one node for :data:`HELD_JOB_MINUTES`
(:func:`submission_hold`), not for the point's nodes and time limit, so that a 256-node
point does not wait for 256 nodes only to write its record. A job that finds no hold on
fewer nodes than its point needs refuses to start the engine (:func:`check_allocation`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpcllm.atomic import atomic_paths
from hpcllm.work_time import STARTUP_MINUTES

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


# A held point's job: one node for the start-up allowance of every point's limit (its
# job's Snakemake and the look at the records take seconds to a few minutes), no work.
HELD_JOB_NODES = 1
HELD_JOB_MINUTES = STARTUP_MINUTES


def submission_hold(
    point: dict, results: str | Path, rerunning: Callable[[], Collection[str]] = tuple
) -> dict | None:
    """The hold the point's job will find (:func:`find_hold` on ``results``), decided on
    the login node before it is submitted; None where it runs, or where the point that
    holds it is among ``rerunning()`` (the points this run still runs: that point goes
    first and the hold is decided again when this point's job is submitted)."""
    hold = find_hold(point, results)
    if hold is None or hold["held_by"] in rerunning():
        return None
    return hold


def held_job_note(point: dict, hold: dict, minutes: float, held_minutes: float) -> str:
    """What the plan says of a point that will be held: its job's time limit
    ``held_minutes`` instead of its own ``minutes``."""
    return (
        f"benchmarks: {point['id']} will be held ({hold['held_by']}, "
        f"{nodes_text(hold['held_by_nodes'])}, failed with {hold['held_by_status']}): its "
        f"job asks for {nodes_text(HELD_JOB_NODES)} for {held_minutes:g} min, not "
        f"{nodes_text(point['nodes'])} for {minutes:g} min, and only writes its record "
        '(hpcllm.bench.hold; docs/benchmarks.md, "Held points").'
    )


def check_allocation(point: dict, environ: Mapping[str, str] | None = None) -> None:
    """Refuse to start a point's engine on fewer nodes than the point needs: its job was
    submitted as held (one node), and the records no longer hold it (its holder was
    rerun or removed in between). Outside a Slurm job, or for a point of a cluster
    without GPUs (its "nodes" are processes), there is nothing to check."""
    environ = os.environ if environ is None else environ
    got = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES")
    if point.get("gpu_model", "cpu") == "cpu" or not (got and got.isdigit()):
        return
    if int(got) < point["nodes"]:
        raise RuntimeError(
            f"hpcllm: {point['id']} needs {nodes_text(point['nodes'])} but its job has "
            f"{nodes_text(int(got))}: it was submitted as held, and no smaller point of "
            "its series holds it any more. Its engine was not started. Run the workflow "
            "again: the job is then submitted on the point's nodes."
        )


@dataclass(frozen=True)
class HeldSaving:
    """What the points held by one failure cost, submitted on their nodes or held on
    one: ``*_limit_gpu_hours`` at their time limits (what a plan prices and Slurm
    reserves), ``gpu_hours_per_minute_*`` per minute a held job lives (what Slurm
    bills: it ends within seconds to minutes either way)."""

    failed: str
    held: tuple[str, ...]
    full_limit_gpu_hours: float
    held_limit_gpu_hours: float
    gpu_hours_per_minute_full: float
    gpu_hours_per_minute_held: float
    largest_nodes: int


def held_saving(
    points: Iterable[dict], failed: str, limit_minutes: Callable[[dict], int], billed_gpus: int
) -> HeldSaving:
    """The saving when ``failed`` (a point id) holds the larger points of its series;
    ``billed_gpus``: the GPUs a node is billed for."""
    by_id = {p["id"]: p for p in points}
    smaller = smaller_points(by_id.values())
    held = [by_id[i] for i, below in smaller.items() if failed in below]
    full_nodes = sum(p["nodes"] for p in held)
    return HeldSaving(
        failed=failed,
        held=tuple(p["id"] for p in held),
        full_limit_gpu_hours=sum(p["nodes"] * limit_minutes(p) for p in held) * billed_gpus / 60,
        held_limit_gpu_hours=len(held) * HELD_JOB_NODES * HELD_JOB_MINUTES * billed_gpus / 60,
        gpu_hours_per_minute_full=full_nodes * billed_gpus / 60,
        gpu_hours_per_minute_held=len(held) * HELD_JOB_NODES * billed_gpus / 60,
        largest_nodes=max((p["nodes"] for p in held), default=0),
    )


def first_failures(points: Iterable[dict]) -> list[str]:
    """Per series, the smallest point on more than one node: the first a failure of the
    network or at start-up can reach, holding every larger point of its series."""
    series: dict[tuple, list[dict]] = {}
    for point in points:
        if point["nodes"] > 1:
            series.setdefault(series_key(point), []).append(point)
    return [min(members, key=lambda p: p["nodes"])["id"] for members in series.values()]


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
    point runs, on the nodes it needs: :func:`check_allocation`). The results folder is
    the one the point's own folder is in."""
    hold = find_hold(point, Path(record_path).parent.parent)
    if hold is None:
        check_allocation(point)
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
