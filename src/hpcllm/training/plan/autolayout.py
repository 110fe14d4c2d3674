"""``layout: auto``: the layouts that fit, ranked by a model, the fastest chosen by measuring.

The experiment keeps its job geometry (``nodes`` x ``procs_per_node`` GPUs, so the DAG's
resources do not depend on the search); within it :func:`candidates` lists every layout
the engine can run: TP (inside a node, dividing the heads), PP (dividing the layers), the
micro batch (dividing the global batch per DP rank), and recomputation only where needed
(the first of none, selective, full that fits; Megatron-LM only). A candidate is one the
plan's own check accepts (:func:`as_planned`: the job as it runs on the site,
job_plan.experiment_as_run, through planner.plan), so its memory is the plan's figure.

Throughput model (a ranking, the measurement decides), seconds per iteration:

    FLOPs(global batch, recompute) / (GPUs x sustained rate)      (hpcllm.work_time)
      x (1 + (PP - 1) / m)          the 1F1B pipeline bubble, m micro batches per DP rank
                                    (Narayanan et al. 2021, sec. 2.2)
      x (1 + TP_COST x (TP - 1))    TP's all-reduces in every layer, on NVLink
      x (1 + TOKENS_HALF / (b x s)) a micro batch of b x s tokens keeps the GPU busier

Where the cluster has no GPU (no rate), the same product with a rate of 1 orders them.

The measuring job (:mod:`hpcllm.training.campaign.measure_layout`) runs the ``measure``
best at full model size on :func:`measure_nodes` of the experiment's nodes (each within
the memory check there, DP across nodes where the campaign's is), a few iterations a
launch after a warm-up, inside one allocation; :func:`search` launches again those the
noise does not separate (:func:`decide`) and writes ``results/layout/<experiment>.json``;
the plan and the segments read it: its choice is the layout the campaign trains with,
kept from its first segment on.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from hpcllm.models.planner import Layout, Memory, PlanError, check_layout, plan

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
# (framework, NCCL and data-index start-up: the canaries' order of magnitude) where the
# measuring job has measured none yet; the plan's estimate before it ran.
START_S = 120.0
# measure: the best predicted that are timed; rounds: the most times one is launched
# (another round only for those the noise does not yet separate from the best).
DEFAULTS = {"measure": 3, "warmup_iterations": 2, "iterations": 3, "rounds": 3}
# Two candidates count as different when their mean times per iteration differ by more
# than this many standard errors of the difference (about 95 % for one pair, Gaussian).
SEPARATION = 2.0
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
    memory_gb: float  # predicted per GPU in the campaign, as the job runs there
    score: float  # predicted seconds per iteration (relative where there is no rate)
    measured_s: float | None = None  # measured seconds per iteration (mean of samples)
    status: str = "not measured yet"
    measure_gb: float | None = None  # predicted per GPU in the measuring job
    samples: tuple[float, ...] = ()  # the timed iterations' seconds, all rounds

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


def as_planned(
    name: str, experiment: dict[str, Any], gpus: int, procs_per_node: int, vocab: int,
    gpu_memory_gb: float | None, transformer_impl: str, headroom: float = 0.9,
) -> Memory | None:  # fmt: skip
    """The memory per GPU of ``experiment`` as its job runs on the site, by the plan's own
    check (job_plan.experiment_as_run, then planner.plan): None where that check refuses
    it, so that no candidate is one the plan would refuse."""
    from hpcllm.training.plan.job_plan import experiment_as_run

    runs, _ = experiment_as_run(experiment, transformer_impl)
    try:
        return plan(name, runs, gpus, vocab, gpu_memory_gb, procs_per_node, headroom)[1]
    except PlanError:
        return None


def candidates(
    name: str,
    experiment: dict[str, Any],
    gpus: int,
    procs_per_node: int,
    vocab: int,
    gpu_memory_gb: float | None,
    rate_tflops: float | None = None,
    transformer_impl: str = "transformer_engine",
    headroom: float = 0.9,
) -> list[Candidate]:
    """Every layout within ``gpus`` that the plan accepts on the site, fastest predicted
    first. ``transformer_impl``: Megatron's on the site (the local layers run without
    sequence parallelism, flash attention and, resuming, the distributed optimizer);
    ``rate_tflops``: the GPU's assumed sustained rate (None: relative scores)."""
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
                    try:
                        layout = check_layout(name, exp, gpus, procs_per_node)
                    except PlanError:
                        break
                    memory = as_planned(
                        name, exp, gpus, procs_per_node, vocab, gpu_memory_gb,
                        transformer_impl, headroom,
                    )  # fmt: skip
                    if memory is None:
                        continue  # the next recomputation, if any, may fit
                    score = predicted_seconds(exp, layout, vocab, rate_tflops)
                    out.append(Candidate(tp, pp, dp, micro, recompute, memory.total, score))
                    break  # recomputation only where needed
    return sorted(out, key=lambda c: (c.score, c.memory_gb, c.name))


def scaled_global_batch(global_batch: int, nodes: int, measure_nodes: int) -> int:
    """The global batch on the measuring job's nodes: the same micro batches per rank."""
    return global_batch * measure_nodes // nodes


def at_nodes(experiment: dict[str, Any], c: Candidate, nodes: int) -> dict[str, Any]:
    """The experiment as the measuring job runs candidate ``c`` on ``nodes`` of its nodes:
    the candidate's layout, DP and the global batch scaled with the nodes (each DP rank
    keeps its micro batches, so its iteration time is the campaign's)."""
    exp = with_layout(experiment, c)
    full = exp["layout"].get("nodes", 1)
    exp["layout"]["nodes"] = nodes
    exp["batch"]["global"] = scaled_global_batch(exp["batch"]["global"], full, nodes)
    return exp


def dp_crosses_nodes(tp: int, dp: int, procs_per_node: int) -> bool:
    """Whether a DP group spans nodes (Megatron's rank order tp-cp-ep-dp-pp: a DP group
    is TP x DP consecutive ranks), so that its gradient all-reduce uses the fabric."""
    return dp > 1 and tp * dp > procs_per_node


def measure_memory(
    name: str, experiment: dict[str, Any], c: Candidate, nodes: int, procs_per_node: int,
    vocab: int, gpu_memory_gb: float | None, transformer_impl: str,
) -> float | None:  # fmt: skip
    """Candidate ``c``'s memory per GPU in a measuring job of ``nodes`` nodes, or None
    where it cannot be measured there: its TP x PP does not fit them, DP does not scale
    down evenly, the plan's check refuses it (fewer DP ranks divide the distributed
    optimizer's state less), or its campaign's DP all-reduce crosses nodes and the
    measurement's would not."""
    full = experiment["layout"].get("nodes", 1)
    if (c.dp * nodes) % full or c.tp * c.pp > nodes * procs_per_node:
        return None
    dp = c.dp * nodes // full
    if dp_crosses_nodes(c.tp, c.dp, procs_per_node) and not dp_crosses_nodes(
        c.tp, dp, procs_per_node
    ):
        return None
    exp = at_nodes(experiment, c, nodes)
    try:
        check_layout(name, exp, nodes * procs_per_node, procs_per_node)
    except PlanError:
        return None
    memory = as_planned(
        name, exp, nodes * procs_per_node, procs_per_node, vocab, gpu_memory_gb,
        transformer_impl,
    )  # fmt: skip
    return None if memory is None else memory.total


def measure_nodes(
    name: str, experiment: dict[str, Any], chosen: list[Candidate], procs_per_node: int,
    vocab: int, gpu_memory_gb: float | None, transformer_impl: str = "transformer_engine",
) -> tuple[int, list[Candidate]]:  # fmt: skip
    """The measuring job's nodes and the candidates with their memory there: the fewest
    of the experiment's nodes (at least two where it spans nodes, DP across them as in
    the campaign) on which every one of ``chosen`` runs within the plan's memory check.
    The experiment's own nodes always qualify (the candidates passed it there)."""
    full = experiment["layout"].get("nodes", 1)
    for n in [d for d in _divisors(full) if d >= min(2, full)]:
        memories = [
            measure_memory(
                name, experiment, c, n, procs_per_node, vocab, gpu_memory_gb, transformer_impl
            )
            for c in chosen
        ]
        if all(m is not None for m in memories) or n == full:
            return n, [
                replace(c, measure_gb=m if m is not None else c.memory_gb)
                for c, m in zip(chosen, memories, strict=True)
            ]
    raise AssertionError("unreachable: the experiment's own nodes qualify")


def recorded_startup_s(records: list[str | os.PathLike]) -> float | None:
    """The longest start-up the site's training canary measured (each of its segments'
    seconds: the launch, its start-up, two iterations of a tiny model and a save; a lower
    bound for a full-size start-up), or None where none has run."""
    seconds = []
    for path in records:
        try:
            record = json.loads(Path(path).read_text())
            seconds += [float(s["seconds"]) for s in record.get("segments", [])]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return max(seconds) if seconds else None


def start_seconds(records: list[str | os.PathLike]) -> float:
    """The start-up a launch is planned with: START_S, or the canary's where longer."""
    return max(START_S, recorded_startup_s(records) or 0.0)


def round_seconds(c: Candidate, opts: dict[str, int], start_s: float = START_S) -> float:
    """One launch of a candidate: start-up and its warm-up and timed iterations."""
    return start_s + (opts["warmup_iterations"] + opts["iterations"]) * c.score


def search_seconds(chosen: list[Candidate], opts: dict[str, int], start_s: float = START_S,
                   worst: bool = False) -> float:  # fmt: skip
    """The measuring job's seconds: one round of each candidate; ``worst``: and every
    further round for the two fastest predicted (the most the search may run)."""
    seconds = sum(round_seconds(c, opts, start_s) for c in chosen)
    if worst and len(chosen) > 1:
        seconds += (opts["rounds"] - 1) * sum(round_seconds(c, opts, start_s) for c in chosen[:2])
    return seconds


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


def _mean_and_error(samples: tuple[float, ...]) -> tuple[float, float]:
    """The mean seconds per iteration and its standard error (none known from one
    sample: an older record's single time, or ``iterations: 1``)."""
    mean = statistics.fmean(samples)
    if len(samples) < 2:
        return mean, 0.0
    return mean, statistics.stdev(samples) / math.sqrt(len(samples))


@dataclass(frozen=True)
class Decision:
    """The measurement's choice: the fastest by its mean, unless the noise does not
    separate it from the next; then the candidates within the noise of the fastest count
    as equal and the one with the least predicted memory per GPU wins (the most headroom;
    then the best predicted)."""

    chosen: Candidate
    margin: float | None  # the next fastest's mean over the fastest's, minus 1
    noise: float | None  # SEPARATION standard errors of that difference, over the mean
    equal: tuple[str, ...] = ()  # the candidates within the noise of the fastest
    # Among equals: how much slower than any of them the chosen may be (its mean less
    # theirs plus SEPARATION standard errors of the difference, over the fastest's mean)
    slower_at_most: float = 0.0

    def describe(self) -> str:
        if self.margin is None:
            return f"{self.chosen.name}: the only candidate measured"
        if not self.equal:
            return (
                f"{self.chosen.name}: faster than the next by {self.margin:.1%} "
                f"(noise {self.noise:.1%}, {SEPARATION:g} standard errors)"
            )
        return (
            f"{self.chosen.name}: {', '.join(self.equal)} are equal within the noise "
            f"(margin {self.margin:.1%}, noise {self.noise:.1%}); the least predicted "
            f"memory per GPU chosen, at most {self.slower_at_most:.1%} slower than the best"
        )


def _samples(c: Candidate) -> tuple[float, ...]:
    if c.samples:
        return tuple(c.samples)
    return (c.measured_s,) if c.measured_s is not None else ()  # an older record's


def decide(measured: list[Candidate]) -> Decision:
    """The choice among the measured candidates (:class:`Decision`)."""
    stats = {c.name: _mean_and_error(_samples(c)) for c in measured if _samples(c)}
    if not stats:
        raise PlanError("no layout candidate was measured: see the measuring job's log")
    ranked = sorted((c for c in measured if c.name in stats), key=lambda c: stats[c.name][0])
    best, mean = ranked[0], stats[ranked[0].name][0]
    if len(ranked) == 1:
        return Decision(best, None, None)

    def noise(c: Candidate, d: Candidate = best) -> float:
        return SEPARATION * math.hypot(stats[d.name][1], stats[c.name][1])

    nxt = ranked[1]
    margin = (stats[nxt.name][0] - mean) / mean
    if stats[nxt.name][0] - mean > noise(nxt):
        return Decision(best, margin, noise(nxt) / mean)
    equal = [c for c in ranked if stats[c.name][0] - mean <= noise(c)]
    chosen = min(equal, key=lambda c: (c.memory_gb, c.score, c.name))
    worst = max(
        stats[chosen.name][0] - stats[c.name][0] + noise(chosen, c)
        for c in equal
        if c is not chosen
    )
    return Decision(
        chosen, margin, noise(nxt) / mean, tuple(c.name for c in equal), max(0.0, worst) / mean
    )


def fastest(measured: list[Candidate]) -> Candidate:
    """The measurement's choice (:func:`decide`)."""
    return decide(measured).chosen


def search(
    listed: list[Candidate],
    count: int,
    time_once: Callable[[Candidate], Candidate],
    rounds: int,
    keep: Callable[[list[Candidate]], None] = lambda _: None,
    fits_in_time: Callable[[Candidate], bool] = lambda _: True,
) -> tuple[list[Candidate], Decision]:
    """Time the first ``count`` of ``listed`` once each (``time_once`` returns the
    candidate with its new samples added, or failed), then again those the noise does
    not separate from the fastest, until it does or each ran ``rounds`` times. ``keep``
    gets the list after every launch (the record of what is measured so far);
    ``fits_in_time`` says whether a candidate's next launch fits the job's time left.
    Candidates with samples already (an earlier attempt's) are not launched again in the
    first round."""
    out = list(listed)
    todo = list(range(min(count, len(out))))
    for round_ in range(rounds):
        for i in todo:
            if round_ == 0 and _samples(out[i]):
                continue  # timed by an earlier attempt of the job (its progress)
            if not fits_in_time(out[i]):
                if not _samples(out[i]):
                    out[i] = replace(out[i], status="not measured: the job's time ran out")
                continue
            out[i] = time_once(out[i])
            keep(out)
        if not any(_samples(c) for c in out):
            break
        decision = decide(out)
        todo = [i for i, c in enumerate(out) if c.name in decision.equal]
        if len(todo) < 2:
            break
    return out, decide(out)


@dataclass(frozen=True)
class AutoPlan:
    """What the plan knows of an auto layout: the candidates, measured where the record
    has them, and the one the campaign runs (the measurement's choice, else the best
    predicted until the measurement)."""

    candidates: tuple[Candidate, ...]
    measure: int  # how many the measuring job runs
    chosen: Candidate
    measured: bool  # the record exists: the choice is the measurement's
    record: str
    search_gpu_hours: float | None  # the record's; or predicted (None: no rate)
    nodes: int  # the measuring job's
    billing: float = 1.0  # the site's billed GPU-hours per GPU-hour of one device
    job_seconds: float | None = None  # the most the measuring job may run (predicted)
    decision: str | None = None  # the record's (Decision.describe)
    notes: tuple[str, ...] = ()


def _refuse_time(where: str, c: Candidate, opts, nodes: int, max_minutes: int) -> PlanError:
    from hpcllm.work_time import MARGIN

    need = MARGIN * round_seconds(c, opts) / 60
    return PlanError(
        f"{where}: the measuring job cannot time even the best predicted layout "
        f"({c.name}) within the site's time limit of {max_minutes} min (gpu_partition."
        f"max_minutes): one launch on {nodes} node(s) needs about {need:,.0f} min with the "
        f"margin ({START_S:.0f} s start-up, {opts['warmup_iterations']} + "
        f"{opts['iterations']} iterations of {c.score:,.0f} s predicted); lower "
        "layout.auto.warmup_iterations and layout.auto.iterations, or use more nodes"
    )


def plan_auto(
    name: str,
    experiment: dict[str, Any],
    gpus: int,
    procs_per_node: int,
    vocab: int,
    gpu_memory_gb: float | None,
    rate_tflops: float | None,
    transformer_impl: str,
    record: str | os.PathLike,
    max_minutes: int | None = None,
    billing: float = 1.0,
) -> AutoPlan:
    """The candidates, the measuring job (nodes, how many it times) and the choice.
    ``max_minutes``: the site's job time limit; ``billing``: its billed GPU-hours per
    GPU-hour of one device (LUMI: one per two GCDs)."""
    from hpcllm.work_time import MARGIN

    listed = candidates(
        name, experiment, gpus, procs_per_node, vocab, gpu_memory_gb, rate_tflops,
        transformer_impl,
    )  # fmt: skip
    where = f"training.experiments.{name}.layout.auto"
    if not listed:
        limit = "" if gpu_memory_gb is None else f" within 90% of the GPU's {gpu_memory_gb:g} GB"
        raise PlanError(
            f"{where}: no layout of {gpus} GPUs runs the model{limit} as the job runs on "
            f"this site ({transformer_impl} layers; TP inside a node, any PP, micro batch, "
            "recomputation); use more nodes or a smaller model"
        )
    opts = settings(experiment["layout"])
    count = min(opts["measure"], len(listed))
    notes = []
    if rate_tflops and max_minutes:
        budget = max_minutes * 60 / MARGIN
        fit = 0
        while fit < count and search_seconds(listed[: fit + 1], opts) <= budget:
            fit += 1
        if fit == 0:
            raise _refuse_time(where, listed[0], opts, experiment["layout"]["nodes"], max_minutes)
        if fit < count:
            notes.append(
                f"measures {fit} of layout.auto.measure = {count}: more do not fit the site's "
                f"{max_minutes} min time limit"
            )
            count = fit
    mnodes, measured = measure_nodes(
        name, experiment, list(listed[:count]), procs_per_node, vocab, gpu_memory_gb,
        transformer_impl,
    )  # fmt: skip
    listed[:count] = measured
    found = load_record(record)
    if found is None:
        cost = job = None
        if rate_tflops:
            cost = search_seconds(listed[:count], opts) * mnodes * procs_per_node / 3600
            job = search_seconds(listed[:count], opts, worst=True)
            if max_minutes:
                job = min(job * MARGIN, max_minutes * 60) / MARGIN
        return AutoPlan(
            tuple(listed), count, listed[0], False, str(record), cost, mnodes, billing, job,
            None, tuple(notes),
        )  # fmt: skip
    by_name = {c.name: c for c in listed}
    merged = []
    for entry in found["candidates"]:
        c = Candidate(**{k: entry[k] for k in Candidate.__dataclass_fields__ if k in entry})
        c = replace(c, samples=tuple(c.samples))
        merged.append(by_name.pop(c.name, c))
        merged[-1] = replace(
            merged[-1], measured_s=c.measured_s, status=c.status, samples=c.samples,
            measure_gb=c.measure_gb,
        )  # fmt: skip
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
        found.get("gpu_hours"), found.get("nodes", mnodes), billing, None,
        found.get("decision"), tuple(notes),
    )  # fmt: skip


def campaign_gpu_hours(auto: AutoPlan, iterations: int, gpus: int) -> float | None:
    """The campaign's GPU-hours at the chosen layout's measured (else predicted) speed;
    None where neither is in seconds (no GPU rate and nothing measured)."""
    s = auto.chosen.measured_s if auto.chosen.measured_s is not None else None
    if s is None and auto.search_gpu_hours is not None:
        s = auto.chosen.score
    return None if s is None else iterations * s * gpus / 3600


def table(name: str, auto: AutoPlan, iterations: int, gpus: int) -> tuple[str, str | None]:
    """The plan's lines for an auto layout (the table and the search's cost, both in the
    site's billed GPU-hours), and a warning where the search costs more than COST_GOAL of
    the campaign."""
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
    gb = [c.measure_gb for c in auto.candidates[: auto.measure] if c.measure_gb is not None]
    if gb and not auto.measured:
        rows.append(
            f"  measuring job: up to {max(gb):.2f} GB per GPU on {auto.nodes} node(s) "
            "(DP and the global batch scaled down, each rank's micro batches kept)"
        )
    rows += [f"  {note}" for note in auto.notes]
    if auto.decision:
        rows.append(f"  decision: {auto.decision}")
    campaign = campaign_gpu_hours(auto, iterations, gpus)
    campaign = None if campaign is None else campaign * auto.billing
    search = None if auto.search_gpu_hours is None else auto.search_gpu_hours * auto.billing
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
                "or its iterations"
            )
    if not auto.measured:
        rows.append("  (predicted: the model's s/iteration; the choice waits for the measurement)")
    return "\n".join(row.rstrip() for row in rows), warning


def write_record(
    path: str | os.PathLike, name: str, measured: list[Candidate], nodes: int, gpus: int,
    wall_s: float, measure: int, partial: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """The measuring job's record; ``partial``: written after each launch (the choice
    so far, where one was measured), so that what was measured survives the job."""
    from hpcllm.atomic import atomic_path

    decision = decide(measured) if not partial or any(_samples(c) for c in measured) else None
    record = {
        "experiment": name,
        "nodes": nodes,
        "gpus": gpus,
        "measure": measure,
        "wall_s": wall_s,
        "gpu_hours": wall_s * gpus / 3600,
        "chosen": asdict(decision.chosen) if decision else None,
        "decision": decision.describe() if decision else None,
        "margin": decision.margin if decision else None,
        "noise": decision.noise if decision else None,
        "equal": list(decision.equal) if decision else [],
        "candidates": [asdict(c) for c in measured],
        "job_id": os.environ.get("SLURM_JOB_ID"),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(record, indent=1) + "\n")
    return record
