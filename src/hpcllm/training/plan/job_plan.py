"""At plan time: a training segment's job on its cluster (time limit, GPUs, nodes, paths).

``segment_job`` sizes the segment's time limit from its work (``hpcllm.work_time``) and
refuses what cannot run on the cluster: more ranks per node than the node has GPUs, more
nodes than the GPU partition has, a ``time.signal_seconds`` or ``time.margin_seconds``
that is not shorter than the time limit, a ``$NAME`` in a tokenizer path; it warns about
GPUs that would sit idle in whole-node jobs (billed, unused).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcllm.clusters import variable_in_path
from hpcllm.models.planner import Memory, PlanError, plan
from hpcllm.work_time import WorkTime, flops_per_iteration, time_limit


@dataclass(frozen=True)
class SegmentJob:
    limit_minutes: int | None  # None: the rule's own (no GPU to size it for)
    work: WorkTime | None
    warnings: tuple[str, ...]
    memory: Memory | None = None  # per GPU, as the engine runs the layout on this cluster


def check_nodes(name: str, layout: dict[str, Any], cluster) -> None:
    """Refuse more ranks per node than a whole-node job has GPUs, and more nodes than the
    cluster's GPU partition has (before the layout's own checks: these say more)."""
    if not (cluster.uses_slurm and cluster.gpus_per_node):
        return
    where = f"training.experiments.{name}.layout"
    nodes, ppn, gpus_per_node = layout["nodes"], layout["procs_per_node"], cluster.gpus_per_node
    if ppn > gpus_per_node:
        raise PlanError(
            f"{where}.procs_per_node: {ppn} ranks per node, but a {cluster.name} node "
            f"has {gpus_per_node} GPUs ({cluster.path}: gpus_per_node); two ranks would "
            f"share a GPU. Set procs_per_node to {gpus_per_node} (or leave it out)."
        )
    if cluster.gpu_partition_nodes and nodes > cluster.gpu_partition_nodes:
        raise PlanError(
            f"{where}.nodes: {nodes} nodes, but {cluster.name}'s GPU partition has "
            f"{cluster.gpu_partition_nodes} ({cluster.path}: gpu_partition.nodes); lower "
            "nodes."
        )


def experiment_as_run(
    experiment: dict[str, Any], transformer_impl: str
) -> tuple[dict[str, Any], list[str]]:
    """The experiment as its engine runs it with ``transformer_impl`` (a segment that may
    resume: megatron_args.as_run), and what of it that drops; the torch engine as asked.
    The one memory model of the plan's check and of layout: auto's candidates."""
    from hpcllm.models.megatron_args import as_run

    impl = transformer_impl if experiment["engine"] == "megatron" else "transformer_engine"
    return as_run(experiment, impl, resumes=True)


def memory_as_run(name: str, prepared, cluster, vocab_size: int) -> tuple[Memory, list[str]]:
    """The memory per GPU of the layout as Megatron-LM runs it on ``cluster`` (refused
    when it does not fit), and a warning for each thing the experiment asks for that it
    runs without there (sequence parallelism, flash attention and the distributed optimizer
    on the local layers)."""
    from hpcllm.models.megatron_args import runs_checkout, transformer_impl_and_reason

    exp, lay = prepared.experiment, prepared.experiment["layout"]
    impl, why = (
        transformer_impl_and_reason(cluster)
        if exp["engine"] == "megatron"
        else ("transformer_engine", "")
    )
    runs, dropped = experiment_as_run(exp, impl)
    gpu_gb = cluster.gpu.memory_gb if cluster.gpu is not None else None
    _, memory = plan(name, runs, prepared.layout.gpus, vocab_size, gpu_gb, lay["procs_per_node"])
    where = f"training.experiments.{name}"
    if dropped:
        warning = (
            f"{where}: asks for {' and '.join(dropped)}, but Megatron-LM runs on "
            f"{cluster.name} without Transformer Engine (--transformer-impl {impl}: {why}): "
            f"the job runs without them, planned at {memory.describe()}"
            + (
                " (the distributed optimizer needs a fused Adam, Transformer Engine's or "
                "Apex's, to resume from a checkpoint)"
                if "the distributed optimizer" in dropped
                else ""
            )
        )
        return memory, [warning]
    if impl == "local" and runs_checkout(cluster):  # found here, not a fact: said anyway
        return memory, [f"{where}: Megatron-LM runs with --transformer-impl local: {why}"]
    return memory, []


def segment_flops(prepared, vocab_size: int) -> float:
    exp = prepared.experiment
    return exp["iterations_per_segment"] * flops_per_iteration(
        exp["model"],
        prepared.layout.global_batch,
        vocab_size,
        exp["layout"].get("recompute", "none"),
    )


def segment_job(
    name: str, prepared, cluster, vocab_size: int, tokenizer: dict[str, Any] | None = None
) -> SegmentJob:
    exp = prepared.experiment
    lay, timing = exp["layout"], exp["time"]
    where = f"training.experiments.{name}"
    nodes, ppn = lay["nodes"], lay["procs_per_node"]
    warnings = []
    for key in ("vocab_file", "merges_file", "tokenizer_json"):
        problem = variable_in_path(
            f"text.tokenizers.{exp['data']['tokenizer']}.{key}", (tokenizer or {}).get(key)
        )
        if problem:
            raise PlanError(problem)
    memory, dropped = memory_as_run(name, prepared, cluster, vocab_size)
    warnings.extend(dropped)
    gpus_per_node = cluster.gpus_per_node
    if not (cluster.uses_slurm and gpus_per_node and cluster.gpu is not None):
        return SegmentJob(timing.get("limit_minutes"), None, tuple(warnings), memory)
    check_nodes(name, lay, cluster)
    work = time_limit(
        segment_flops(prepared, vocab_size),
        nodes * ppn,
        cluster.gpu.rate_tflops(exp.get("precision", "bf16")),
        cluster.max_minutes,
    )
    limit = timing.get("limit_minutes") or work.limit_minutes
    if limit > cluster.max_minutes:
        raise PlanError(
            f"{where}.time.limit_minutes: {limit} min, more than the {cluster.max_minutes} "
            f"min {cluster.name}'s GPU partition allows ({cluster.path}: "
            "gpu_partition.max_minutes); lower it, or leave it out to size it from the work."
        )
    if work.clamped and not timing.get("limit_minutes"):
        warnings.append(
            f"{where}: a segment's work ({work.describe()}) needs more than the "
            f"{cluster.max_minutes} min {cluster.name} allows; it gets {limit} min and "
            "stops early at its time limit (the next segment resumes it). Lower "
            "iterations_per_segment to fit."
        )
    for key in ("signal_seconds", "margin_seconds"):
        if timing[key] >= limit * 60:
            raise PlanError(
                f"{where}.time.{key}: {timing[key]} s is not shorter than the segment's "
                f"time limit of {limit} min ({limit * 60} s); the segment would stop before "
                f"it trains. Lower time.{key} (or raise time.limit_minutes)."
            )
    if ppn < gpus_per_node:
        # in the site's billing unit (LUMI's GPU-hour is 2 of its 8 GCDs)
        per_gpu = cluster.billed_gpus_per_node / gpus_per_node
        idle = exp["segments"] * nodes * (gpus_per_node - ppn) * per_gpu * limit / 60
        warnings.append(
            f"{where}.layout.procs_per_node: {ppn} ranks on {cluster.name}'s whole nodes of "
            f"{gpus_per_node} GPUs: {gpus_per_node - ppn} GPUs per node stay idle, up to "
            f"{idle:,.1f} billed GPU-hours wasted ({exp['segments']} segments x {nodes} nodes "
            f"x {limit} min). Set procs_per_node to {gpus_per_node} (and the batch or tp to "
            "match)."
        )
    return SegmentJob(limit, work, tuple(warnings), memory)
