"""What a plan costs before anything is queued: node-hours and GPU-hours per rule.

Each GPU job asks Slurm for ``nodes`` whole nodes for up to ``runtime`` minutes; that is
what the allocation can be charged, so the cost is counted from the time limit, not from
a guess of how long the job will really take. ``max_gpu_hours`` (config) stops a real
run of a larger plan before the first job is submitted; a dry run prints the same
figures and warns.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

MAX_GPU_HOURS_KEY = "max_gpu_hours"


@dataclass(frozen=True)
class Job:
    rule: str
    nodes: int
    runtime_min: float


@dataclass(frozen=True)
class RuleCost:
    rule: str
    jobs: int
    node_hours: float
    gpu_hours: float


def runtime_minutes(value) -> float:
    """A ``runtime`` resource in minutes: a number, or a string such as "90", "2h", "30m"."""
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip().lower()
    for suffix, factor in (("min", 1), ("m", 1), ("h", 60), ("d", 1440)):
        if text.endswith(suffix) and text[: -len(suffix)].strip().replace(".", "", 1).isdigit():
            return float(text[: -len(suffix)]) * factor
    try:
        return float(text)
    except ValueError:
        raise ValueError(
            f"runtime {value!r}: expected minutes or a number with m, h or d"
        ) from None


def cost_per_rule(jobs: list[Job], gpus_per_node: int) -> list[RuleCost]:
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for job in jobs:
        totals[job.rule][0] += 1
        totals[job.rule][1] += job.nodes * job.runtime_min / 60
    return [
        RuleCost(rule, int(n), node_h, node_h * gpus_per_node)
        for rule, (n, node_h) in sorted(totals.items())
    ]


def describe(costs: list[RuleCost], cluster: str) -> list[str]:
    """The cost lines of a plan, one per rule and the total."""
    if not costs:
        return [f"Cost on {cluster}: no GPU jobs to run (0 node-hours, 0 GPU-hours)"]
    lines = [f"Cost on {cluster} (whole nodes for each job's time limit):"]
    for c in costs:
        lines.append(
            f"  {c.rule}: {c.jobs} job(s), {c.node_hours:,.1f} node-hours, "
            f"{c.gpu_hours:,.1f} GPU-hours"
        )
    node_h = sum(c.node_hours for c in costs)
    gpu_h = sum(c.gpu_hours for c in costs)
    lines.append(f"  total: {node_h:,.1f} node-hours, {gpu_h:,.1f} GPU-hours")
    return lines


def over_limit(costs: list[RuleCost], max_gpu_hours: float, cluster: str) -> str | None:
    """A message naming the key to raise when the plan asks for more than the limit.

    A ``--config`` on the command line replaces the profile's ``config:`` (which names
    the cluster), so the way out it gives names the cluster again.
    """
    gpu_h = sum(c.gpu_hours for c in costs)
    if gpu_h <= max_gpu_hours:
        return None
    return (
        f"this plan asks for {gpu_h:,.1f} GPU-hours, more than {MAX_GPU_HOURS_KEY} = "
        f"{max_gpu_hours:,g}. Check the cost lines above (a dry run, -n, prints them); to "
        f"run it, raise the limit: --config cluster={cluster} "
        f"{MAX_GPU_HOURS_KEY}={int(gpu_h) + 1} (or {MAX_GPU_HOURS_KEY}: "
        f"{int(gpu_h) + 1} in a --configfile)"
    )
