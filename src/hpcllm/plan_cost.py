"""What a plan costs before anything is queued: node-hours and GPU-hours per rule.

Each job is priced by what it holds: a GPU job asks Slurm for ``nodes`` whole nodes for
up to ``runtime`` minutes, and so does every CPU job on a site where all jobs get whole
GPU nodes (no CPU partition: tokenize batches, train_tokenizer, merges, pack_lmdb,
prepare_data_cache there hold a GPU node each). That is what the allocation can be
charged, so the cost is counted from the time limits: an upper bound. Beside it, the
time to train each experiment is estimated from its tokens and a per-GPU rate (the one
measured by the user's own benchmark summary where there is one, else the cluster's
assumed rate). ``max_gpu_hours`` (config) stops a real run of a larger plan before the
first job is submitted; a dry run and the look-only commands print the same figures and
warn.
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

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
        return [f"Cost on {cluster}: no jobs that hold GPU nodes (0 node-hours, 0 GPU-hours)"]
    lines = [f"Cost on {cluster} (whole nodes for each job's time limit, an upper bound):"]
    for c in costs:
        lines.append(
            f"  {c.rule}: {c.jobs} job(s), {c.node_hours:,.1f} node-hours, "
            f"{c.gpu_hours:,.1f} GPU-hours"
        )
    node_h = sum(c.node_hours for c in costs)
    gpu_h = sum(c.gpu_hours for c in costs)
    lines.append(f"  total: {node_h:,.1f} node-hours, {gpu_h:,.1f} GPU-hours")
    return lines


def describe_cpu_only(
    cpu_costs: list[RuleCost], all_costs: list[RuleCost], cluster: str, why: str | None
) -> list[str]:
    """Where CPU-only jobs hold GPU nodes: which rules, their share of the GPU-hours, and
    why (the cluster file's ``no_cpu_partition``, with its source)."""
    if not cpu_costs:
        return []
    share = sum(c.gpu_hours for c in cpu_costs)
    total = sum(c.gpu_hours for c in all_costs)
    rules = ", ".join(c.rule for c in cpu_costs)
    return [
        f"CPU-only jobs on GPU nodes on {cluster}: {rules}: {share:,.1f} of the "
        f"{total:,.1f} GPU-hours, each for its time limit (prepare_data_cache's and "
        "export_model's sized from their work). Why: "
        + (why or "the cluster file names no CPU partition (partitions.cpu: null)")
    ]


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


@dataclass(frozen=True)
class HangRisk:
    """What one hang of a GPU job type holds: its nodes until the watchdog's bound ends
    it (the training segment's, hpcllm.training.campaign.watchdog), or until its time
    limit where the job has no watchdog."""

    job: str  # the rule, with the experiment for a training segment
    nodes: int
    limit_min: float  # the job's time limit
    bound_min: float | None = None  # while it trains (None: the job has no watchdog)
    worst_min: float | None = None  # in a start-up, or a save not measured yet
    reason: str = ""  # where the bound comes from

    def gpu_hours(self, minutes: float, gpus_per_node: float) -> float:
        """The GPU-hours a hang holds for ``minutes`` (never beyond the time limit)."""
        return self.nodes * min(minutes, self.limit_min) / 60 * gpus_per_node

    def describe(self, gpus_per_node: float) -> str:
        def gpu_hours(minutes: float) -> str:
            return f"{self.gpu_hours(minutes, gpus_per_node):,.1f}"

        nodes = f"{self.nodes} node{'s' if self.nodes != 1 else ''}"
        without = (
            f"{gpu_hours(self.limit_min)} GPU-hours without it ({nodes} x the time limit, "
            f"{self.limit_min:,.0f} min)"
        )
        if self.bound_min is None:
            return f"  {self.job}: no watchdog: a hang costs {without.replace(' without it', '')}"
        text = (
            f"  {self.job}: a hang costs {gpu_hours(self.bound_min)} GPU-hours with the "
            f"watchdog ({nodes} x its bound of {self.bound_min:,.0f} min: {self.reason})"
        )
        if self.worst_min is not None and self.worst_min > self.bound_min:
            text += (
                f", up to {gpu_hours(self.worst_min)} in a start-up or a save not measured "
                f"yet ({self.worst_min:,.0f} min)"
            )
        return f"{text}; {without}"


def describe_hang_risk(risks: list[HangRisk], cluster: str, gpus_per_node: float) -> list[str]:
    """The plan's lines on what a hang costs, one per GPU job type."""
    if not risks:
        return []
    return [
        f"What a hang costs on {cluster} (its nodes held until the watchdog ends it, or "
        "until the time limit):"
    ] + [r.describe(gpus_per_node) for r in risks]


@dataclass(frozen=True)
class TrainingEstimate:
    """The time to train an experiment from its tokens and a per-GPU rate."""

    experiment: str
    tokens: float
    flops: float
    gpus: int
    tflops_per_gpu: float
    source: str  # where the rate comes from
    limit_gpu_hours: float  # what the segments' time limits allow (the upper bound)
    # the site's billed GPU-hours per GPU-hour of one device (LUMI bills a MI250X, two
    # GCDs, as one GPU: 0.5), so that both figures are in the site's unit
    billed_per_gpu: float = 1.0

    @property
    def hours(self) -> float:
        return self.flops / (self.gpus * self.tflops_per_gpu * 1e12) / 3600

    def describe(self) -> str:
        tokens = f"{self.tokens / 1e9:,.2f}B" if self.tokens >= 1e8 else f"{self.tokens:,.0f}"
        return (
            f"  {self.experiment}: {tokens} tokens, {self.flops:.3g} FLOPs: "
            f"about {self.hours:,.1f} h on {self.gpus} GPUs at {self.tflops_per_gpu:,.0f} "
            f"TFLOP/s per GPU ({self.source}), "
            f"{self.hours * self.gpus * self.billed_per_gpu:,.1f} GPU-hours; "
            f"the time limits allow up to {self.limit_gpu_hours:,.1f}"
        )


def measured_tflops(
    summary: str | Path, cluster: str, preset: str | None, precision: str
) -> tuple[float, str] | None:
    """The median TFLOP/s per GPU of the user's own successful language benchmark runs of
    ``preset`` on ``cluster`` in ``precision`` (results/bench/summary.csv), and where it
    comes from; None when there are none."""
    path = Path(summary)
    if preset is None or not path.is_file():
        return None
    with open(path, newline="") as f:
        rows = [
            r
            for r in csv.DictReader(f)
            if r.get("benchmark") == "language"
            and r.get("cluster") == cluster
            and r.get("preset") == preset
            and r.get("precision") == precision
            and r.get("status") == "ok"
            and r.get("tflops_per_gpu") not in (None, "", "nan")
        ]
    if not rows:
        return None
    rate = statistics.median(float(r["tflops_per_gpu"]) for r in rows)
    return rate, f"measured: median of {len(rows)} run(s) of {preset} in {path}"


def describe_training(estimates: list[TrainingEstimate], cluster: str) -> list[str]:
    if not estimates:
        return []
    return [f"Time to train on {cluster} (an estimate; the cost above is the bound):"] + [
        e.describe() for e in estimates
    ]
