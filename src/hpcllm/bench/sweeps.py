"""Expand benchmark experiments into sweep points: one point = one job = one run.

Node counts double from the smallest that holds one model replica up to the cluster's
maximum given in the experiment (``max_nodes: {juwels: 256, default: 16}``); a cluster
with neither its own entry nor a ``default`` gets no points from that experiment, so the
built-in tiny experiments (``max_nodes: {local: 2}``) stay off real clusters and the full
sweeps stay off laptops.

On a cluster without GPUs (``gpus_per_node: 0``, the local machine) a "node" of the sweep
is one process: the local sweep 1, 2 runs 1 and 2 processes on this machine.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from hpcllm.clusters import variable_in_path

# Scaling modes as the EPICURE guide names them (docs/benchmarks.md). Language: strong
# keeps the global batch, weak keeps the gradient-accumulation steps per replica (the global
# batch grows with the replicas). Vision: weak only, a fixed per-GPU batch over the fixed
# dataset (the global batch grows with the GPUs, an epoch is the same images at every
# node count); fixing the global batch would shrink the per-GPU batch below what fills a GPU.
SCALINGS = ("strong", "weak")
VISION_SCALINGS = ("weak",)
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


class SweepError(ValueError):
    """An experiment that cannot be expanded; the message names the experiment and key."""


@dataclass(frozen=True)
class ClusterFacts:
    """What the sweep needs to know about a cluster (from ``hpcllm.clusters``)."""

    name: str
    gpus_per_node: int  # 0: CPU only, one process per sweep "node"
    gpu_memory_gb: float = 0.0
    peak_tflops: dict = field(default_factory=dict)  # precision -> dense peak TFLOP/s per GPU
    gpu_model: str = "cpu"
    assumed_tflops: dict = field(default_factory=dict)  # precision -> TFLOP/s per GPU assumed
    max_minutes: int = 1440  # the GPU partition's longest time limit
    partition_nodes: int | None = None  # the GPU partition's nodes (None: not known)
    whole_nodes: bool = False  # Slurm jobs get whole GPU nodes
    # Megatron's --transformer-impl here ("local" on AMD: no sequence parallelism, no
    # flash attention; megatron_args.as_run)
    transformer_impl: str = "transformer_engine"
    gpu_vendor: str = "nvidia"
    # A container runtime: Megatron-LM is in the training image (/opt/Megatron-LM)
    containers: bool = True
    # Without one: the Megatron-LM checkout the cluster file names (megatron_lm), if any
    megatron_lm: str | None = None

    @property
    def procs_per_node(self) -> int:
        return self.gpus_per_node or 1


@dataclass
class Point:
    """One run of a sweep; every field is a column of the summary."""

    id: str
    benchmark: str
    experiment: str
    model: str
    scaling: str
    precision: str
    nodes: int
    procs_per_node: int
    gpus: int
    min_nodes: int
    cluster: str
    gpu_model: str
    peak_tflops: float | None
    settings: dict = field(default_factory=dict)  # model/batch/layout settings of the run

    def row(self) -> dict:
        data = asdict(self)
        data.update(data.pop("settings"))
        return data


def facts_of(cluster) -> ClusterFacts:
    """The sweep's view of a :class:`hpcllm.clusters.Cluster`."""
    from hpcllm.models.megatron_args import transformer_impl_for

    gpu = cluster.gpu
    return ClusterFacts(
        name=cluster.name,
        gpus_per_node=cluster.gpus_per_node,
        gpu_memory_gb=gpu.memory_gb if gpu else 0.0,
        peak_tflops={"bf16": gpu.peak_bf16_tflops, "fp32": gpu.peak_fp32_tflops} if gpu else {},
        gpu_model=gpu.model if gpu else "cpu",
        assumed_tflops={p: gpu.rate_tflops(p) for p in ("bf16", "fp16", "fp32")} if gpu else {},
        max_minutes=cluster.max_minutes,
        partition_nodes=cluster.gpu_partition_nodes,
        whole_nodes=cluster.whole_nodes,
        transformer_impl=transformer_impl_for(cluster),
        gpu_vendor=gpu.vendor if gpu else "nvidia",
        containers=cluster.uses_containers,
        megatron_lm=cluster.megatron_lm,
    )


def load_experiment(
    name: str, spec: str | dict, root: str | Path = ".", schema: dict | None = None
) -> dict:
    """An experiment from its config entry (an inline mapping or a YAML file path),
    checked against ``schema`` (benchmarks.schema.yaml) where given."""
    where = f"benchmarks.experiments.{name}"
    if isinstance(spec, dict):
        data = spec
    else:
        path = Path(root) / spec
        if not path.is_file():
            raise SweepError(f"{where}: file {spec} does not exist")
        with open(path) as f:
            data = yaml.safe_load(f)
        if not isinstance(data, dict):
            raise SweepError(f"{spec}: expected a mapping with the experiment's keys")
        where = f"{spec}"
    if schema is not None:
        import jsonschema

        kind = data.get("benchmark")
        if kind not in ("language", "vision"):
            raise SweepError(f"{where}: 'benchmark' must be language or vision, not {kind!r}")
        validator = jsonschema.Draft202012Validator(
            {"$defs": schema["$defs"], "$ref": f"#/$defs/{kind}"}
        )
        errors = list(validator.iter_errors(data))
        if errors:
            raise SweepError(
                "\n".join(
                    f"{where}: key {'.'.join(map(str, e.absolute_path)) or '(top level)'}: {e.message}"
                    for e in errors[:10]
                )
                + "\n(see docs/benchmarks.md)"
            )
    return data


def node_counts(min_nodes: int, max_nodes: int) -> list[int]:
    """min, 2 min, 4 min, ... up to max (inclusive)."""
    counts = []
    n = min_nodes
    while n <= max_nodes:
        counts.append(n)
        n *= 2
    return counts


def _max_nodes(where: str, spec: dict, cluster: ClusterFacts) -> int | None:
    value = spec.get(cluster.name, spec.get("default"))
    if value is not None and (not isinstance(value, int) or value < 1):
        raise SweepError(
            f"{where}.max_nodes.{cluster.name}: expected a positive integer, got {value!r}"
        )
    if value is not None and cluster.partition_nodes and value > cluster.partition_nodes:
        raise SweepError(
            f"{where}.max_nodes.{cluster.name}: {value} nodes, but {cluster.name}'s GPU "
            f"partition has {cluster.partition_nodes} (config/clusters/{cluster.name}.yaml: "
            f"gpu_partition.nodes); lower max_nodes.{cluster.name}"
        )
    return value


def not_doubling(where: str, min_nodes: int, max_nodes: int, cluster: str) -> str | None:
    """A message when max_nodes is not min_nodes times a power of two (the sweep's node
    counts double, so the largest count asked for would silently not run)."""
    counts = node_counts(min_nodes, max_nodes)
    if not counts or counts[-1] == max_nodes:
        return None
    return (
        f"{where}: max_nodes.{cluster} is {max_nodes}, but node counts double from "
        f"{min_nodes}: the sweep runs {', '.join(map(str, counts))} nodes, not {max_nodes}. "
        f"Set max_nodes.{cluster} to {counts[-1]} (or {counts[-1] * 2}) to say so."
    )


# ResNet-50's training FLOPs per 224x224 image: 4.09 G multiply-adds forward (torchvision's
# resnet50 weights table, "GFLOPS 4.09", counts multiply-adds), 2 FLOPs each, the backward
# pass twice the forward; the pixel count scales it. Validation runs the forward only.
RESNET50_TRAIN_FLOPS = 3 * 2 * 4.09e9
# Training and validation images of ImageNet-1k (ILSVRC-2012: 1,281,167 and 50,000) and
# TinyImageNet-200 (100,000 and 10,000), for the datasets named so; a dataset of another
# name is sized as ImageNet-1k, the largest the benchmark runs on.
DATASET_IMAGES = {"imagenet": (1_281_167, 50_000), "tinyimagenet": (100_000, 10_000)}
# The share of the cluster's assumed (large transformer) rate that ResNet-50 training
# sustains: about 2,600 images/s per A100 with AMP in NVIDIA's and timm's published
# figures, 64 TFLOP/s, half JUWELS' assumed 125.
VISION_SHARE_OF_ASSUMED = 0.5


def vision_rate(precision: str, cluster: ClusterFacts) -> float:
    """The TFLOP/s per GPU assumed for a vision point. FP32 convolutions run on NVIDIA's
    tensor cores as TF32 (PyTorch's torch.backends.cudnn.allow_tf32 is on by default),
    at half the bf16 rate; elsewhere at the fp32 rate."""
    rate = cluster.assumed_tflops["bf16"]
    if precision == "fp32":
        rate = rate / 2 if cluster.gpu_vendor == "nvidia" else cluster.assumed_tflops["fp32"]
    return VISION_SHARE_OF_ASSUMED * rate


def vision_flops(row: dict) -> float:
    """A vision point's FLOPs: its epochs of training images (times ``repeat``, at most
    ``max_batches_per_epoch`` batches) and, where it validates, its validation images."""
    train, val = DATASET_IMAGES.get(row["dataset"], DATASET_IMAGES["imagenet"])
    images = train * row.get("repeat", 1)
    if row.get("max_batches_per_epoch"):
        images = min(images, row["max_batches_per_epoch"] * row["global_batch"])
    if not row.get("val_split"):
        val = 0
    per_image = RESNET50_TRAIN_FLOPS * (row.get("image_size", 224) / 224) ** 2
    return row["epochs"] * (images + val / 3) * per_image


def point_time_limit(row: dict, cluster: ClusterFacts):
    """A point's :class:`hpcllm.work_time.WorkTime`: its work's FLOPs at the cluster's
    assumed rate (a language point's iterations, a vision point's epochs); None on a
    cluster without GPUs."""
    from hpcllm.bench.language import experiment_of
    from hpcllm.work_time import flops_per_iteration, time_limit

    if not cluster.assumed_tflops:
        return None
    if row["benchmark"] == "vision":
        rate = vision_rate(row["precision"], cluster)
        return time_limit(vision_flops(row), row["gpus"], rate, cluster.max_minutes)
    exp = experiment_of(row)
    vocab = exp["model"].get("vocab_size") or 50257
    flops = row["iterations"] * flops_per_iteration(
        exp["model"], row["global_batch"], vocab, exp["layout"].get("recompute", "none")
    )
    rate = cluster.assumed_tflops.get(row["precision"], cluster.assumed_tflops["bf16"])
    return time_limit(flops, row["gpus"], rate, cluster.max_minutes)


def expand_experiment(
    name: str, exp: dict, cluster: ClusterFacts, dropped: list[str] | None = None
) -> list[Point]:
    """The experiment's points; those that cannot fit the GPUs are left out, and a
    message per point saying why is appended to ``dropped``."""
    if not _NAME.match(name):
        raise SweepError(
            f"benchmarks.experiments: name {name!r} may hold only letters, digits, _ -"
        )
    kind = exp.get("benchmark")
    notes: list[str] = []
    if kind == "language":
        for key in ("data", "tokenizer"):
            problem = variable_in_path(f"benchmarks.experiments.{name}.{key}", exp.get(key))
            if problem:
                raise SweepError(problem)
        problem = warmup_problem(name, exp)
        if problem:
            raise SweepError(problem)
        points = _expand_language(name, exp, cluster, notes)
        if points and exp.get("engine", "megatron") == "megatron":
            problem = megatron_problem(name, exp, cluster)
            if problem:
                raise SweepError(problem)
        fits = []
        for point in points:
            problem = language_plan_problem(point, cluster)
            if problem is None:
                fits.append(point)
                work = point_time_limit(point.row(), cluster)
                if work is not None and work.clamped:
                    notes.append(
                        f"{point.id}: its work ({work.describe()}) needs more than the "
                        f"{cluster.max_minutes} min {cluster.name}'s GPU partition allows; "
                        "it may stop at its time limit. Lower iterations."
                    )
            else:
                notes.append(problem)
        if dropped is not None:
            dropped.extend(notes)
        return fits
    if kind == "vision":
        points = _expand_vision(name, exp, cluster, notes)
        for point in points:
            work = point_time_limit(point.row(), cluster)
            if work is not None and work.clamped:
                notes.append(
                    f"{point.id}: its work ({work.describe()}) needs more than the "
                    f"{cluster.max_minutes} min {cluster.name}'s GPU partition allows; "
                    "it may stop at its time limit. Lower epochs or max_batches_per_epoch."
                )
        if dropped is not None:
            dropped.extend(notes)
        return points
    raise SweepError(f"experiment {name}: 'benchmark' must be language or vision, not {kind!r}")


def expand_all(
    experiments: dict,
    cluster: ClusterFacts,
    root: str | Path = ".",
    schema: dict | None = None,
    dropped: list[str] | None = None,
) -> list[Point]:
    points: list[Point] = []
    for name, spec in experiments.items():
        exp = load_experiment(name, spec, root, schema)
        points.extend(expand_experiment(name, exp, cluster, dropped))
    ids = [p.id for p in points]
    if len(set(ids)) != len(ids):
        raise SweepError("benchmarks.experiments: two experiments give the same point ids")
    return points


def warmup_problem(name: str, exp: dict) -> str | None:
    """A language experiment whose warm-up leaves no logged iteration to measure."""
    iterations, warmup = exp.get("iterations", 20), exp.get("warmup_iterations", 3)
    if warmup < iterations:
        return None
    unset = [k for k in ("iterations", "warmup_iterations") if k not in exp]
    return (
        f"benchmarks.experiments.{name}.warmup_iterations: {warmup} is not fewer than its "
        f"iterations ({iterations})"
        + (f" ({' and '.join(unset)} unset: the default)" if unset else "")
        + ": every iteration of a run would be left out of its metrics, which would then "
        "measure nothing. Lower warmup_iterations or raise iterations."
    )


def megatron_problem(name: str, exp: dict, cluster: ClusterFacts) -> str | None:
    """Why a megatron-engine experiment's points cannot run on ``cluster`` (no Megatron-LM:
    no container runtime and no checkout named, or a checkout not at the pin), or None."""
    from hpcllm.models.megatron_args import checkout_problem

    if cluster.containers:
        return None
    engine = "megatron" if "engine" in exp else "megatron (unset: the default)"
    where = f"benchmarks.experiments.{name}.engine: {engine}"
    if cluster.megatron_lm is not None:
        problem = checkout_problem(cluster.megatron_lm)
        return f"{where} on cluster {cluster.name}: {problem}" if problem else None
    return (
        f"{where} runs Megatron-LM's pretrain_gpt.py from the training container "
        f"(/opt/Megatron-LM), but cluster {cluster.name} has no container runtime "
        f"(config/clusters/{cluster.name}.yaml: container_runtime: none) and names no "
        "Megatron-LM checkout (megatron_lm). Name one there, set engine: torch to run it "
        f"here, or leave {cluster.name} out of its max_nodes and run it with a GPU "
        "cluster's profile."
    )


def language_plan_problem(point: Point, cluster: ClusterFacts) -> str | None:
    """Why the point cannot run (the training planner's layout and memory checks), or None.

    Checked at plan time, so that a point that would fail at start-up costs no job.
    """
    from hpcllm.bench.language import experiment_of
    from hpcllm.models.megatron_args import as_run
    from hpcllm.models.planner import PlanError, plan

    row = point.row()
    exp = experiment_of(row)
    if row["engine"] == "megatron":  # the memory of what runs, not of what is asked for
        exp, _ = as_run(exp, cluster.transformer_impl)
    vocab = exp["model"].get("vocab_size") or 50257
    memory_gb = cluster.gpu_memory_gb if cluster.gpus_per_node and cluster.gpu_memory_gb else None
    try:
        plan(point.id, exp, point.gpus, vocab, memory_gb, point.procs_per_node)
    except PlanError as e:
        reason = str(e).replace(f"training.experiments.{point.id}", "").lstrip(":. ")
        return f"{point.id}: left out, it cannot run on {cluster.name}: {reason}"
    return None


def _peak(cluster: ClusterFacts, precision: str) -> float | None:
    key = "fp32" if precision == "fp32" else "bf16"  # mixed precision runs on bf16/fp16 units
    return cluster.peak_tflops.get(key)


def point_id(exp: str, model: str, scaling: str, precision: str, nodes: int) -> str:
    return f"{exp}.{model}.{scaling}.{precision}.n{nodes:04d}"


def _expand_language(name: str, exp: dict, cluster: ClusterFacts, notes: list[str]) -> list[Point]:
    where = f"experiment {name}"
    per_node = cluster.procs_per_node
    micro = exp.get("micro_batch", 1)
    points = []
    # Megatron's local layers (no Transformer Engine) have no sequence parallelism: the
    # points say what runs, and the plan says what is dropped (megatron_args.as_run).
    sequence_parallel = bool(exp.get("sequence_parallel", True))
    if exp.get("engine", "megatron") == "megatron" and cluster.transformer_impl == "local":
        if sequence_parallel:
            notes.append(
                f"{where}: sequence_parallel is true, but Megatron-LM runs on {cluster.name} "
                "without Transformer Engine (--transformer-impl local): its points run "
                "without sequence parallelism and flash attention, and their memory is "
                "planned so"
            )
        sequence_parallel = False
    for model, m in exp["models"].items():
        mwhere = f"{where}, model {model}"
        max_nodes = _max_nodes(
            mwhere, {**exp.get("max_nodes", {}), **m.get("max_nodes", {})}, cluster
        )
        if max_nodes is None:
            continue
        replica = m["gpus_per_replica"]
        # Tensor parallelism inside a node, pipeline parallelism across nodes.
        tp = math.gcd(replica, per_node) if cluster.gpus_per_node else 1
        if replica % tp:
            raise SweepError(f"{mwhere}: gpus_per_replica {replica} is not a multiple of TP {tp}")
        pp = replica // tp
        min_nodes = max(1, math.ceil(replica / per_node))
        note = not_doubling(mwhere, min_nodes, max_nodes, cluster.name)
        if note:
            notes.append(note)
        for nodes in node_counts(min_nodes, max_nodes):
            gpus = nodes * per_node
            if gpus % replica:
                raise SweepError(
                    f"{mwhere}: {nodes} nodes x {per_node} GPUs do not hold whole replicas of "
                    f"{replica} GPUs; set gpus_per_replica to a divisor of {gpus}"
                )
            dp = gpus // replica
            for scaling in exp.get("scaling", SCALINGS):
                if scaling == "strong":
                    global_batch = m["strong_global_batch"]
                    if global_batch % (micro * dp):
                        raise SweepError(
                            f"{mwhere}: strong_global_batch {global_batch} is not divisible by "
                            f"micro batch {micro} x data parallel {dp} at {nodes} nodes; lower "
                            f"max_nodes.{cluster.name} or change the batch"
                        )
                else:
                    global_batch = m["weak_grad_accum"] * micro * dp
                for precision in exp.get("precision", ["bf16"]):
                    settings = {
                        "engine": exp.get("engine", "megatron"),
                        "preset": m["preset"],
                        "model_overrides": m.get("overrides", {}),
                        "seq_length": exp.get("seq_length", 2048),
                        "micro_batch": micro,
                        "global_batch": global_batch,
                        "grad_accum": global_batch // (micro * dp),
                        "tp": tp,
                        "pp": pp,
                        "dp": dp,
                        "sequence_parallel": sequence_parallel and tp > 1,
                        "distributed_optimizer": bool(exp.get("distributed_optimizer", True)),
                        "iterations": exp.get("iterations", 20),
                        "warmup_iterations": exp.get("warmup_iterations", 3),
                        "data": exp.get("data", "mock"),
                        "tokenizer": exp.get("tokenizer"),
                    }
                    if exp.get("eod_token"):  # only where set: other points keep their params
                        settings["eod_token"] = exp["eod_token"]
                    points.append(
                        Point(
                            id=point_id(name, model, scaling, precision, nodes),
                            benchmark="language",
                            experiment=name,
                            model=model,
                            scaling=scaling,
                            precision=precision,
                            nodes=nodes,
                            procs_per_node=per_node,
                            gpus=gpus,
                            min_nodes=min_nodes,
                            cluster=cluster.name,
                            gpu_model=cluster.gpu_model,
                            peak_tflops=_peak(cluster, precision),
                            settings=settings,
                        )
                    )
    return points


def batch_per_gpu(exp: dict, memory_gb: float, where: str) -> int:
    """The per-GPU batch: a fixed ``batch_per_gpu``, else the entry of ``batch_by_memory``
    for the largest memory size (GB) the GPU has (128 for 40 GB, 256 for 64, 512 for 80)."""
    if "batch_per_gpu" in exp:
        return exp["batch_per_gpu"]
    table = {float(k): v for k, v in exp.get("batch_by_memory", {}).items()}
    fitting = [k for k in table if k <= memory_gb + 0.5]
    if not fitting:
        raise SweepError(
            f"{where}: no batch_by_memory entry fits a GPU of {memory_gb} GB; "
            f"add one or set batch_per_gpu"
        )
    return table[max(fitting)]


def _expand_vision(name: str, exp: dict, cluster: ClusterFacts, notes: list[str]) -> list[Point]:
    where = f"experiment {name}"
    max_nodes = _max_nodes(where, exp.get("max_nodes", {}), cluster)
    if max_nodes is None:
        return []
    per_node = cluster.procs_per_node
    batch = batch_per_gpu(exp, cluster.gpu_memory_gb, where)
    epochs = exp.get("epochs", 5)
    measured = exp.get("measured_epoch", 4)
    if not 1 <= measured <= epochs:
        raise SweepError(f"{where}: measured_epoch {measured} is not within 1..epochs ({epochs})")
    model = exp.get("model", "resnet50")
    points = []
    min_nodes = exp.get("min_nodes", 1)
    scalings = exp.get("scaling", VISION_SCALINGS)
    for scaling in scalings:
        if scaling not in VISION_SCALINGS:
            raise SweepError(
                f"{where}: scaling '{scaling}' is not a vision mode; the vision benchmark "
                "runs EPICURE's weak scaling only (a fixed per-GPU batch over the fixed "
                "dataset): set `scaling: [weak]` (docs/benchmarks.md)"
            )
    repeat = exp.get("repeat", 1)
    note = not_doubling(where, min_nodes, max_nodes, cluster.name)
    if note:
        notes.append(note)
    for nodes in node_counts(min_nodes, max_nodes):
        for scaling in scalings:
            for precision in exp.get("precision", ["fp32", "amp"]):
                settings = {
                    "dataset": exp["dataset"],
                    "split": exp.get("split", "train"),
                    "repeat": repeat,
                    "batch_per_gpu": batch,
                    "global_batch": batch * nodes * per_node,
                    "epochs": epochs,
                    "measured_epoch": measured,
                    "image_size": exp.get("image_size", 224),
                    "num_classes": exp.get("num_classes"),
                    "workers": exp.get("workers", 8),
                    "learning_rate": exp.get("learning_rate", 0.1),
                    "max_batches_per_epoch": exp.get("max_batches_per_epoch"),
                    "stage_in": bool(exp.get("stage_in", True)),
                    "stage_in_method": exp.get("stage_in_method", "copy"),
                    "stage_in_timeout_s": exp.get("stage_in_timeout_s"),
                    "val_split": exp.get("val_split", "val"),
                    "model_impl": exp.get("model_impl", "auto"),
                    "warmup_epochs": exp.get("warmup_epochs", 5),
                    "label_smoothing": exp.get("label_smoothing", 0.0),
                    "weight_decay": exp.get("weight_decay", 1e-4),
                    "momentum": exp.get("momentum", 0.9),
                    "warmup_iterations": 0,
                }
                points.append(
                    Point(
                        id=point_id(name, model, scaling, precision, nodes),
                        benchmark="vision",
                        experiment=name,
                        model=model,
                        scaling=scaling,
                        precision=precision,
                        nodes=nodes,
                        procs_per_node=per_node,
                        gpus=nodes * per_node,
                        min_nodes=min_nodes,
                        cluster=cluster.name,
                        gpu_model=cluster.gpu_model,
                        peak_tflops=_peak(cluster, precision),
                        settings=settings,
                    )
                )
    return points
