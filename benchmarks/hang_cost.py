"""What one hang of a training segment costs, with and without the segment watchdog.

A hung job holds its nodes until something ends it: Slurm's time limit without the
watchdog, the watchdog's bound with it (hpcllm.training.campaign.watchdog). From the
plan's own functions (the segment's time limit sized from its work:
hpcllm.training.plan.job_plan.segment_job; the bound: watchdog.bounds; GPU-hours:
hpcllm.plan_cost.HangRisk) this prints, per point, the GPU-hours one hang costs without
the watchdog, with it before anything is measured (the bound is the ceiling) and once a
segment measured its iterations (taken here as the plan's own estimate of an iteration:
the work at the cluster's assumed rate), and what the watchdog saves per event:
nodes x GPUs billed per node x (time limit - bound).

The points: the 800M example (config/experiments/opengptx_800m.yaml, 4 nodes) and a
256-node segment (the gpt3_175b preset, TP 4 x PP 32 x DP 8 on 1,024 GPUs, 500
iterations a segment), both on JUWELS' facts by default. No Slurm, no GPU.
docs/training.md quotes its output (tests/clusters/test_plan_cost.py checks that).

Usage: python benchmarks/hang_cost.py [--cluster juwels]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import yaml

from hpcllm.clusters import load_cluster
from hpcllm.plan_cost import HangRisk
from hpcllm.training.campaign.watchdog import bounds
from hpcllm.training.plan.experiment import prepare_experiment
from hpcllm.training.plan.job_plan import segment_job

REPO = Path(__file__).resolve().parents[1]
# What the cluster files' $VARS stand for here (nothing is submitted).
ENVIRON = {"HPCLLM_SCRATCH": "/scratch", "HPCLLM_ACCOUNT": "acct", "HPCLLM_PARTITION": "gpu"}
VOCAB = 50257  # the plan's vocabulary where the tokenizer is not trained yet


def example_800m() -> tuple[str, dict]:
    text = (REPO / "config" / "experiments" / "opengptx_800m.yaml").read_text()
    return "opengptx_800m", yaml.safe_load(text)["training"]["experiments"]["opengptx_800m"]


def point_256_nodes() -> tuple[str, dict]:
    _, example = example_800m()
    return "gpt3_175b on 256 nodes", {
        "engine": "megatron",
        "preset": "gpt3_175b",
        "data": example["data"],
        "layout": {"nodes": 256, "tp": 4, "pp": 32},
        "segments": 10,
        "iterations_per_segment": 500,
        "log_interval": 10,
    }


@dataclass(frozen=True)
class HangCost:
    name: str
    nodes: int
    gpus_per_node: float  # billed
    limit_min: float
    ceiling_min: float  # the bound before anything is measured
    measured_min: float  # the bound once an iteration is measured (the plan's estimate)
    iteration_s: float
    without: float  # GPU-hours a hang holds
    with_ceiling: float
    with_measured: float

    @property
    def saved(self) -> tuple[float, float]:
        """GPU-hours the watchdog saves per event: before and after a measurement."""
        return self.without - self.with_ceiling, self.without - self.with_measured


def hang_cost(cluster, name: str, raw: dict) -> HangCost:
    """One point's hang on ``cluster``: its experiment prepared as the plan prepares it."""
    from snakemake.utils import validate

    section = {"experiments": {name.split()[0]: raw}}
    # the schema's defaults, as the workflow fills them
    validate(section, str(REPO / "workflow" / "schemas" / "training.schema.yaml"))
    raw = section["experiments"][name.split()[0]]
    tok = raw["data"]["tokenizer"]
    text = {
        "sources": {s: {"type": "local"} for s in raw["data"]["sources"]},
        "tokenizers": {tok: {"type": "train", "vocab_size": VOCAB}},
        "tokenize": {"tokenizers": [tok]},
    }
    prepared = prepare_experiment(name.split()[0], raw, text, cluster)
    job = segment_job(name.split()[0], prepared, cluster, VOCAB)
    exp = prepared.experiment
    iteration = job.work.work_minutes * 60 / exp["iterations_per_segment"]
    log_interval, eval_iters = int(exp.get("log_interval") or 1), int(exp.get("eval_iters") or 0)
    heartbeats = exp["engine"] == "torch"
    before = bounds(cluster.watchdog, None, heartbeats, log_interval, eval_iters)
    after = bounds(
        cluster.watchdog,
        {"iteration_seconds": round(iteration, 3), "segment": 1},
        heartbeats,
        log_interval,
        eval_iters,
    )
    nodes = exp["layout"]["nodes"]
    risk = HangRisk(f"train_segment {name}", nodes, job.limit_minutes)
    per_node = cluster.billed_gpus_per_node
    return HangCost(
        name=name,
        nodes=nodes,
        gpus_per_node=per_node,
        limit_min=job.limit_minutes,
        ceiling_min=before.step / 60,
        measured_min=after.step / 60,
        iteration_s=iteration,
        without=risk.gpu_hours(job.limit_minutes, per_node),
        with_ceiling=risk.gpu_hours(before.step / 60, per_node),
        with_measured=risk.gpu_hours(after.step / 60, per_node),
    )


def costs(cluster_name: str = "juwels") -> tuple[list[HangCost], object]:
    cluster = load_cluster(cluster_name, REPO / "config" / "clusters", environ=ENVIRON)
    return [hang_cost(cluster, *point) for point in (example_800m(), point_256_nodes())], cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="juwels", help="a cluster file's name")
    args = parser.parse_args()
    found, cluster = costs(args.cluster)
    dog = cluster.watchdog
    print(
        f"{cluster.name}: {cluster.billed_gpus_per_node:g} GPUs billed a node; watchdog floor "
        f"{dog.floor_seconds / 60:g} min, ceiling {dog.ceiling_seconds / 60:g} min"
    )
    print(
        f"{'point':<24} {'nodes':>5} {'limit':>7} {'bound':>13} {'without':>9} "
        f"{'with':>15} {'saved per hang':>17}"
    )
    for c in found:
        print(
            f"{c.name:<24} {c.nodes:>5} {c.limit_min:>4.0f} min {c.ceiling_min:>3.0f} / "
            f"{c.measured_min:>2.0f} min {c.without:>9,.1f} {c.with_ceiling:>7,.1f} / "
            f"{c.with_measured:>5,.1f} {c.saved[0]:>8,.1f} / {c.saved[1]:>6,.1f}"
        )
    print(
        "GPU-hours per hang; bound and 'with': before anything is measured (the ceiling) / "
        "once an iteration is (here the plan's estimate: "
        + ", ".join(f"{c.iteration_s:.2f} s for {c.name}" for c in found)
        + ")"
    )


if __name__ == "__main__":
    main()
