"""What held points cost on a cluster's sweep: submitted on their nodes, or on one.

For each series of the sweep (config/experiments/language.yaml by default) the smallest
point on more than one node fails at start-up (a wrong interface, a rendezvous that
never meets): every larger point of the series is held (hpcllm.bench.hold). This prints,
per failure and in all, the held points' nodes and GPU-hours

- at their time limits (what the plan prices and Slurm reserves: whole nodes for the
  limit), submitted on their nodes or held on one node for HELD_JOB_MINUTES, and
- per minute a held job lives (what Slurm bills: a held job ends within seconds to a few
  minutes, once its Snakemake has started and read the records),

and the largest held job's share of the GPU partition (what the scheduler drains for it).
No Slurm, no GPU: the sweep is expanded for the cluster file as the workflow's plan does.
docs/benchmarks.md ("Held points") quotes its JUWELS figures
(tests/bench/test_hold.py checks that they are this script's).

Usage: python benchmarks/held_points_cost.py [--cluster juwels]
       [--experiment language=config/experiments/language.yaml]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hpcllm.bench.hold import HELD_JOB_MINUTES, HeldSaving, first_failures, held_saving
from hpcllm.bench.sweeps import expand_all, facts_of, point_time_limit
from hpcllm.clusters import load_cluster
from hpcllm.configuration import load_schema

REPO = Path(__file__).resolve().parents[1]


def sweep_savings(cluster_name: str, experiments: dict) -> tuple[list[HeldSaving], object]:
    """The saving of each series' first failure on ``cluster_name``'s sweep."""
    cluster = load_cluster(cluster_name, REPO / "config" / "clusters")
    facts = facts_of(cluster)
    schema = load_schema(REPO / "workflow" / "schemas" / "benchmarks.schema.yaml")
    points = [p.row() for p in expand_all(experiments, facts, root=REPO, schema=schema)]

    def limit_minutes(point: dict) -> int:
        work = point_time_limit(point, facts)
        return work.limit_minutes if work else 120  # as bench_runtime_min

    savings = [
        held_saving(points, failed, limit_minutes, cluster.billed_gpus_per_node)
        for failed in first_failures(points)
    ]
    return [s for s in savings if s.held], cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="juwels", help="a cluster file's name")
    parser.add_argument(
        "--experiment", default="language=config/experiments/language.yaml", help="NAME=FILE"
    )
    args = parser.parse_args()
    name, _, path = args.experiment.partition("=")
    savings, cluster = sweep_savings(args.cluster, {name: path})
    partition = cluster.gpu_partition_nodes
    print(
        f"{cluster.name}: {cluster.billed_gpus_per_node} GPUs billed a node; a held job: "
        f"1 node for {HELD_JOB_MINUTES} min"
    )
    for s in savings:
        print(
            f"  {s.failed} fails: {len(s.held)} points held, "
            f"{s.full_limit_gpu_hours:.0f} -> {s.held_limit_gpu_hours:.0f} GPU-hours at "
            f"their limits, {s.gpu_hours_per_minute_full:.1f} -> "
            f"{s.gpu_hours_per_minute_held:.1f} GPU-hours a minute, largest job "
            f"{s.largest_nodes} nodes"
        )
    full = sum(s.full_limit_gpu_hours for s in savings)
    held = sum(s.held_limit_gpu_hours for s in savings)
    per_min_full = sum(s.gpu_hours_per_minute_full for s in savings)
    per_min_held = sum(s.gpu_hours_per_minute_held for s in savings)
    largest = max((s.largest_nodes for s in savings), default=0)
    share = f" ({100 * largest / partition:.0f} % of {partition})" if partition else ""
    print(
        f"  in all: {sum(len(s.held) for s in savings)} points held; at their limits "
        f"{full:.0f} GPU-hours on their nodes, {held:.0f} held on one; per minute a held "
        f"job lives {per_min_full:.1f} and {per_min_held:.1f} GPU-hours; largest held job "
        f"{largest} nodes{share}"
    )


if __name__ == "__main__":
    main()
