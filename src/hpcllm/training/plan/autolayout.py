"""``layout: auto``: the layouts that fit, ranked by a model, the fastest chosen by measuring.

The experiment keeps its job geometry (``nodes`` x ``procs_per_node`` GPUs, so the DAG's
resources do not depend on the search); within it :func:`candidates` lists every layout
the engine can run: TP (inside a node, dividing the heads), PP (dividing the layers), the
micro batch (dividing the global batch per DP rank), and recomputation only where needed
(the first of none, selective, full whose estimate fits; Megatron-LM only). Memory is the
planner's model (:func:`hpcllm.models.planner.estimate_memory`); a candidate fits under
``headroom`` x the GPU's memory (all fit where the memory is unknown: the CPU).

Throughput model (a ranking, the measurement decides), seconds per iteration:

    FLOPs(global batch, recompute) / (GPUs x sustained rate)      (hpcllm.work_time)
      x (1 + (PP - 1) / m)          the 1F1B pipeline bubble, m micro batches per DP rank
                                    (Narayanan et al. 2021, sec. 2.2)
      x (1 + TP_COST x (TP - 1))    TP's all-reduces in every layer, on NVLink
      x (1 + TOKENS_HALF / (b x s)) a micro batch of b x s tokens keeps the GPU busier

Where the cluster has no GPU (no rate), the same product with a rate of 1 orders them.

The measuring job (:mod:`hpcllm.training.campaign.measure_layout`) runs the ``measure``
best at full size, a few iterations each after a warm-up, inside one allocation, and
writes ``results/layout/<experiment>.json``; the plan and the segments read it: the
fastest measured is the layout the campaign trains with, kept from its first segment on.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from hpcllm.models.planner import Layout, PlanError, check_layout, estimate_memory

# A TP degree's cost on NVLink per extra rank (an assumption: Megatron-LM's own scaling
# tables lose a few per cent per doubling inside a node, Narayanan et al. 2021 fig. 13).
TP_COST = 0.04
# Tokens per micro batch at which the GPU's efficiency is half-way to its best (an
# assumption: small GEMMs leave tensor cores idle).
TOKENS_HALF = 256
# Micro batches tried: powers of two up to this.
MAX_MICRO = 16
RECOMPUTE = ("none", "selective", "full")
# Seconds each measured candidate spends outside its iterations on a GPU cluster
# (framework, NCCL and data-index start-up: the canaries' order of magnitude); only for
# the plan's estimate of the search's cost before it ran.
START_S = 120.0
DEFAULTS = {"measure": 3, "warmup_iterations": 2, "iterations": 3}
# Rows of the plan's table (at least the measured ones).
SHOWN = 8
# The search's share of the campaign's GPU-hours above which the plan warns.
COST_GOAL = 0.01


@dataclass(frozen=True)
class Candidate:
    tp: int
    pp: int
    dp: int
    micro: int
    recompute: str
    memory_gb: float  # predicted, per GPU
    score: float  # predicted seconds per iteration (relative where there is no rate)
    measured_s: float | None = None  # measured seconds per iteration
    status: str = "not measured yet"

    @property
    def name(self) -> str:
        return f"tp{self.tp}-pp{self.pp}-dp{self.dp}-mb{self.micro}-{self.recompute}"

    def same_layout(self, other: Candidate | dict) -> bool:
        o = other if isinstance(other, dict) else asdict(other)
        return all(o.get(k) == getattr(self, k) for k in ("tp", "pp", "micro", "recompute"))


def settings(layout: dict[str, Any]) -> dict[str, int]:
    """The search's settings of an experiment's ``layout.auto`` (true or a mapping)."""
    auto = layout.get("auto")
    return {**DEFAULTS, **(auto if isinstance(auto, dict) else {})}


def is_auto(experiment: dict[str, Any]) -> bool:
    return bool(experiment.get("layout", {}).get("auto"))


def with_layout(experiment: dict[str, Any], c: Candidate | dict) -> dict[str, Any]:
    """The experiment with the candidate's TP, PP, micro batch and recomputation."""
    get = c.get if isinstance(c, dict) else lambda k: getattr(c, k)
    lay = {**experiment["layout"], "tp": get("tp"), "pp": get("pp"), "recompute": get("recompute")}
    if get("tp") == 1:
        lay["sequence_parallel"] = False
    return {**experiment, "layout": lay, "batch": {**experiment["batch"], "micro": get("micro")}}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def predicted_seconds(
    experiment: dict[str, Any], layout: Layout, vocab: int, rate_tflops: float | None
) -> float:
    """The throughput model (see the module's docstring)."""
    from hpcllm.work_time import flops_per_iteration

    model = experiment["model"]
    recompute = experiment["layout"].get("recompute", "none")
    flops = flops_per_iteration(model, layout.global_batch, vocab, recompute)
    rate = (rate_tflops or 1.0) * 1e12
    bubble = 1 + (layout.pp - 1) / layout.microbatches
    tensor = 1 + TP_COST * (layout.tp - 1)
    small = 1 + TOKENS_HALF / (layout.micro_batch * model["seq_length"])
    return flops / (layout.gpus * rate) * bubble * tensor * small


def candidates(
    name: str,
    experiment: dict[str, Any],
    gpus: int,
    procs_per_node: int,
    vocab: int,
    gpu_memory_gb: float | None,
    rate_tflops: float | None = None,
    sequence_parallel: bool = True,
    headroom: float = 0.9,
) -> list[Candidate]:
    """Every layout within ``gpus`` that fits, fastest predicted first.

    ``sequence_parallel``: whether the engine runs it here (not on Megatron's local
    layers); ``rate_tflops``: the GPU's assumed sustained rate (None: relative scores)."""
    model, glob = experiment["model"], experiment["batch"]["global"]
    megatron = experiment["engine"] == "megatron"
    tps = [t for t in _divisors(procs_per_node) if model["num_attention_heads"] % t == 0]
    pps = [p for p in _divisors(model["num_layers"])]
    out = []
    for tp in tps if megatron else [1]:
        for pp in pps if megatron else [1]:
            if gpus % (tp * pp):
                continue
            dp = gpus // (tp * pp)
            if glob % dp:
                continue
            per_rank = glob // dp
            micros = [2**i for i in range(int(math.log2(MAX_MICRO)) + 1) if 2**i <= per_rank]
            for micro in micros:
                if per_rank % micro:
                    continue
                user = experiment["layout"].get("recompute", "none")
                for recompute in RECOMPUTE if megatron else [user]:
                    exp = with_layout(
                        experiment, {"tp": tp, "pp": pp, "micro": micro, "recompute": recompute}
                    )
                    if not sequence_parallel:
                        exp["layout"]["sequence_parallel"] = False
                    try:
                        layout = check_layout(name, exp, gpus, procs_per_node)
                    except PlanError:
                        continue
                    memory = estimate_memory(exp, layout, vocab).total
                    if gpu_memory_gb is not None and memory > headroom * gpu_memory_gb:
                        continue  # the next recomputation, if any, may fit
                    score = predicted_seconds(exp, layout, vocab, rate_tflops)
                    out.append(Candidate(tp, pp, dp, micro, recompute, memory, score))
                    break  # recomputation only where needed
    return sorted(out, key=lambda c: (c.score, c.memory_gb, c.name))


def measure_nodes(chosen: list[Candidate], nodes: int, procs_per_node: int) -> int:
    """Nodes of the measuring job: one where every measured candidate's model (TP x PP)
    fits on one, two where it fits on two, else the experiment's; never more than it has,
    and a share of its nodes that keeps the micro batches per DP rank (DP scaled down
    with the global batch)."""
    need = max((c.tp * c.pp for c in chosen), default=1)
    for n in (1, 2):
        if n <= nodes and nodes % n == 0 and need <= n * procs_per_node:
            if all((c.dp * n) % nodes == 0 for c in chosen):
                return n
    return nodes


def scaled_global_batch(global_batch: int, nodes: int, measure_nodes: int) -> int:
    """The global batch on the measuring job's nodes: the same micro batches per rank."""
    return global_batch * measure_nodes // nodes


def record_path(name: str, workdir: str | os.PathLike = ".") -> Path:
    return Path(workdir) / "results" / "layout" / f"{name}.json"


def load_record(path: str | os.PathLike) -> dict[str, Any] | None:
    """The measuring job's record, or None where it has not run; a broken one refused."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        record["chosen"]["tp"], record["candidates"][0]["micro"]  # noqa: B018
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise PlanError(
            f"{path}: not a layout record of the measuring job ({type(e).__name__}: {e}); "
            "delete it to measure again"
        ) from None
    return record


def fastest(measured: list[Candidate]) -> Candidate:
    """The fastest measured candidate (ties: the smaller predicted memory)."""
    done = [c for c in measured if c.measured_s is not None]
    if not done:
        raise PlanError("no layout candidate was measured: see the measuring job's log")
    return min(done, key=lambda c: (c.measured_s, c.memory_gb))


@dataclass(frozen=True)
class AutoPlan:
    """What the plan knows of an auto layout: the candidates, measured where the record
    has them, and the one the campaign runs (the fastest measured, else the best
    predicted until the measurement)."""

    candidates: tuple[Candidate, ...]
    measure: int  # how many the measuring job runs
    chosen: Candidate
    measured: bool  # the record exists: the choice is the measurement's
    record: str
    search_gpu_hours: float | None  # the record's; or predicted (None: no rate)
    nodes: int  # the measuring job's


def plan_auto(
    name: str,
    experiment: dict[str, Any],
    gpus: int,
    procs_per_node: int,
    vocab: int,
    gpu_memory_gb: float | None,
    rate_tflops: float | None,
    sequence_parallel: bool,
    record: str | os.PathLike,
) -> AutoPlan:
    listed = candidates(
        name, experiment, gpus, procs_per_node, vocab, gpu_memory_gb, rate_tflops,
        sequence_parallel,
    )  # fmt: skip
    where = f"training.experiments.{name}.layout.auto"
    if not listed:
        raise PlanError(
            f"{where}: no layout of {gpus} GPUs fits the model in "
            f"{gpu_memory_gb} GB per GPU (TP inside a node, any PP, micro batch, "
            "recomputation); use more nodes or a smaller model"
        )
    opts = settings(experiment["layout"])
    count = min(opts["measure"], len(listed))
    nodes = experiment["layout"].get("nodes", 1)
    mnodes = measure_nodes(list(listed[:count]), nodes, procs_per_node)
    found = load_record(record)
    if found is None:
        iters = opts["warmup_iterations"] + opts["iterations"]
        cost = None
        if rate_tflops:
            seconds = sum(START_S + iters * c.score * mnodes / nodes for c in listed[:count])
            cost = seconds * mnodes * procs_per_node / 3600
        return AutoPlan(tuple(listed), count, listed[0], False, str(record), cost, mnodes)
    by_name = {c.name: c for c in listed}
    merged = []
    for entry in found["candidates"]:
        c = Candidate(**{k: entry[k] for k in Candidate.__dataclass_fields__ if k in entry})
        merged.append(by_name.pop(c.name, c))
        merged[-1] = replace(merged[-1], measured_s=c.measured_s, status=c.status)
    merged += sorted(by_name.values(), key=lambda c: c.score)
    chosen = next((c for c in merged if c.same_layout(found["chosen"])), None)
    if chosen is None or chosen.name not in {c.name for c in listed}:
        raise PlanError(
            f"{where}: {record} chose {found['chosen']}, which is not a layout of this "
            "experiment any more (its model, batch or nodes changed); delete the record to "
            "measure again (a Megatron-LM campaign with checkpoints keeps its layout: "
            "restart it, see docs/training.md)"
        )
    return AutoPlan(
        tuple(merged), found.get("measure", count), chosen, True, str(record),
        found.get("gpu_hours"), found.get("nodes", mnodes),
    )  # fmt: skip


def campaign_gpu_hours(auto: AutoPlan, iterations: int, gpus: int) -> float | None:
    """The campaign's GPU-hours at the chosen layout's measured (else predicted) speed;
    None where neither is in seconds (no GPU rate and nothing measured)."""
    s = auto.chosen.measured_s if auto.chosen.measured_s is not None else None
    if s is None and auto.search_gpu_hours is not None:
        s = auto.chosen.score
    return None if s is None else iterations * s * gpus / 3600


def table(name: str, auto: AutoPlan, iterations: int, gpus: int) -> tuple[str, str | None]:
    """The plan's lines for an auto layout (the table and the search's cost), and a
    warning where the search costs more than COST_GOAL of the campaign."""
    rows = [
        f"{name}: layout: auto, {len(auto.candidates)} layouts fit; the measuring job "
        f"runs the best {auto.measure} on {auto.nodes} node(s) ({auto.record})",
        f"  {'layout':<28} {'memory/GPU':>10} {'predicted':>10} {'measured s/it':>16}  chosen",
    ]
    shown = max(SHOWN, auto.measure)
    for i, c in enumerate(auto.candidates[:shown]):
        measured = f"{c.measured_s:.4g}" if c.measured_s is not None else (
            c.status if auto.measured else ("not measured yet" if i < auto.measure else "-")
        )  # fmt: skip
        rows.append(
            f"  {c.name:<28} {c.memory_gb:>8.2f}GB {c.score:>10.4g} {measured:>16}  "
            + ("<-" if c.same_layout(auto.chosen) else "")
        )
    if len(auto.candidates) > shown:
        rows.append(f"  ... {len(auto.candidates) - shown} more, slower by the model")
    campaign = campaign_gpu_hours(auto, iterations, gpus)
    search = auto.search_gpu_hours
    warning = None
    if search is None:
        rows.append("  search: GPU-hours unknown until measured (no GPU rate on this cluster)")
    else:
        share = f" = {search / campaign:.2%} of the campaign's {campaign:,.2f}" if campaign else ""
        rows.append(
            f"  search: {search:,.3f} GPU-hours{'' if auto.measured else ' (predicted)'}{share}"
        )
        if campaign and search > COST_GOAL * campaign:
            warning = (
                f"training.experiments.{name}.layout.auto: the layout search costs "
                f"{search:,.2f} GPU-hours, {search / campaign:.1%} of the campaign's "
                f"{campaign:,.1f} (goal: at most {COST_GOAL:.0%}); lower layout.auto.measure "
                "or its iterations, or set the layout yourself"
            )
    if not auto.measured:
        rows.append("  (predicted: the model's s/iteration; the choice waits for the measurement)")
    return "\n".join(row.rstrip() for row in rows), warning


def write_record(
    path: str | os.PathLike, name: str, measured: list[Candidate], nodes: int, gpus: int,
    wall_s: float, measure: int,
) -> dict[str, Any]:  # fmt: skip
    from hpcllm.atomic import atomic_path

    chosen = fastest(measured)
    record = {
        "experiment": name,
        "nodes": nodes,
        "gpus": gpus,
        "measure": measure,
        "wall_s": wall_s,
        "gpu_hours": wall_s * gpus / 3600,
        "chosen": asdict(chosen),
        "candidates": [asdict(c) for c in measured],
        "job_id": os.environ.get("SLURM_JOB_ID"),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(record, indent=1) + "\n")
    return record
