# The pre-flight stage's globals and input/params functions (its rules: preflight.smk,
# which includes this file first). Only on Slurm clusters with GPUs: there the GPU jobs
# (train_segment, bench_language, bench_vision) wait for their canary, which waits for the
# site probe of its image (hpcllm.preflight; docs/clusters.md, "Pre-flight").
from snakemake.io import ancient

from hpcllm.preflight import canary as _canary
from hpcllm.preflight import probe as _probe

PREFLIGHT = CLUSTER.uses_slurm and CLUSTER.gpus_per_node > 0
PREFLIGHT_DIR = f"results/preflight/{CLUSTER.name}"
# A development QOS whose limits the cluster file does not know: asked of sacctmgr once,
# by the controller, so that a pre-flight job over them keeps the profile's QOS instead
# of pending behind the limit (the plan says which; hpcllm.preflight.probe).
_DEVEL_QOS_ASKED = (None, "")
if PREFLIGHT and workflow.is_main_process and _probe.devel_qos_unknown(CLUSTER):
    _DEVEL_QOS_ASKED = _probe.ask_qos_limits(CLUSTER.devel_qos.name)
_PREFLIGHT_CLUSTER = _probe.with_asked_limits(CLUSTER, _DEVEL_QOS_ASKED[0])
# Image (or "bare": no container runtime) -> the purposes of the jobs that run in it.
PROBE_IMAGES = {}
for _purpose in ("train", "vision"):
    _image = image_for(CLUSTER, _purpose, CONTAINERS["use"])
    PROBE_IMAGES.setdefault(_image or "bare", []).append(_purpose)
CANARY_KINDS = (
    "train_megatron",
    "train_torch",
    "language_megatron",
    "language_torch",
    "vision",
)
# The GPU rule each canary stands for (its profile resources give the canary its node).
CANARY_RULE = {
    "train": "train_segment",
    "language": "bench_language",
    "vision": "bench_vision",
}


def _image_of(purpose):
    image = image_for(CLUSTER, purpose, CONTAINERS["use"])
    return image or "bare"


def _sif(image):
    return None if image == "bare" else f"containers/{image}.sif"


def probe_record(image):
    return _probe.record_path(CLUSTER.name, image)


def canary_record(kind):
    return f"{PREFLIGHT_DIR}/canary/{kind}.json"


def preflight_of(kind):
    """The canary record a GPU job of ``kind`` waits for ([] where there is no pre-flight).
    Ancient: a canary run again (new facts, new image) does not make finished jobs stale.
    """
    if not PREFLIGHT:
        return []
    if workflow.is_main_process and not _CHECKED:
        _note = _probe.devel_qos_note(CLUSTER, _preflight_jobs(), _DEVEL_QOS_ASKED)
        if _note:
            logger.info(_note)
    if workflow.is_main_process and kind not in _CHECKED:
        _CHECKED.add(kind)
        image = _image_of("vision" if kind == "vision" else "train")
        _warning = _canary.rerun_warning(
            probe_record(image), probe_key(SimpleNamespace(image=image)), _sif(image)
        ) or _canary.rerun_warning(
            canary_record(kind), canary_key(SimpleNamespace(kind=kind)), _sif(image)
        )
        if _warning:
            logger.warning(f"Warning: {_warning}")
        if kind.startswith("train_"):
            _warning = _probe.signal_lead_warning(
                probe_record(image), _signal_leads(kind.removeprefix("train_"))
            )
            if _warning:
                logger.warning(f"Warning: {_warning}")
    return [ancient(canary_record(kind))]


def _preflight_jobs():
    """The pre-flight's jobs, their nodes and minutes (for the plan's development QOS line)."""
    return {
        "the site probe": (1, _probe.RUNTIME_MIN),
        "the canaries": (
            max(canary_nodes(kind) for kind in CANARY_KINDS),
            _canary.RUNTIME_MIN,
        ),
    }


def _signal_leads(engine):
    """Seconds each planned experiment of ``engine`` gives its workers after SIGTERM."""
    from hpcllm.training.campaign.engine_process import shutdown_timeout

    return {
        name: shutdown_timeout(EXPERIMENTS[name].experiment)
        for name in _planned_experiments()
        if EXPERIMENTS[name].experiment["engine"] == engine
    }


_CHECKED = set()  # canary kinds whose record was compared with the plan


def train_preflight(wildcards):
    return preflight_of(
        f"train_{EXPERIMENTS[wildcards.experiment].experiment['engine']}"
    )


def bench_preflight(point):
    kind = "vision" if point["benchmark"] == "vision" else f"language_{point['engine']}"
    return preflight_of(kind)


def _planned_experiments():
    return TRAINING.get("run") or list(EXPERIMENTS)


def canary_source(kind):
    """The job a canary scales down: the first experiment (those training.run names
    first) or benchmark point of its type."""
    family, _, engine = kind.partition("_")
    if family == "train":
        for name in [*_planned_experiments(), *EXPERIMENTS]:
            if EXPERIMENTS[name].experiment["engine"] == engine:
                return name
    else:
        for point_id, point in BENCH_POINTS.items():
            if point["benchmark"] == family and (
                family == "vision" or point["engine"] == engine
            ):
                return point_id
    raise WorkflowError(f"canary {kind}: the plan has no job of this type")


def canary_nodes(kind):
    """Two nodes where the plan's jobs of this type run on more than one, else one
    (hpcllm.preflight.canary.canary_nodes)."""
    family, _, engine = kind.partition("_")
    if family == "train":
        sizes = [
            EXPERIMENTS[name].experiment["layout"].get("nodes", 1)
            for name in [*_planned_experiments(), *EXPERIMENTS]
            if EXPERIMENTS[name].experiment["engine"] == engine
        ]
    else:
        sizes = [
            point["nodes"]
            for point in BENCH_POINTS.values()
            if point["benchmark"] == family
            and (family == "vision" or point["engine"] == engine)
        ]
    return _canary.canary_nodes(max(sizes, default=1))


def canary_nodes_of(wildcards):
    return canary_nodes(wildcards.kind)


def _train_canary(kind):
    name = canary_source(kind)
    return _canary.train_canary_experiment(
        TRAINING["experiments"][name], CLUSTER, canary_nodes(kind)
    )


def canary_geometry(kind):
    """What the canary runs, in the terms of its launch (engine, layout, precision)."""
    if kind.startswith("train_"):
        exp = _train_canary(kind)
        return {
            k: exp.get(k) for k in ("engine", "preset", "layout", "precision", "model")
        }
    point = BENCH_POINTS[canary_source(kind)]
    if kind == "vision":
        scaled = _canary.vision_canary_point(point, CLUSTER, canary_nodes(kind))
        keys = (
            "model",
            "model_impl",
            "precision",
            "batch_per_gpu",
            "image_size",
            "stage_in",
        )
    else:
        scaled = _canary.language_canary_point(point, CLUSTER, canary_nodes(kind))
        keys = ("engine", "preset", "model_overrides", "tp", "pp", "dp", "precision")
        keys += ("sequence_parallel", "distributed_optimizer", "seq_length")
    return {k: scaled.get(k) for k in ("nodes", "procs_per_node", *keys)}


def canary_key(wildcards):
    image = _image_of("vision" if wildcards.kind == "vision" else "train")
    return _canary.canary_key(
        CLUSTER, wildcards.kind, _sif(image), canary_geometry(wildcards.kind)
    )


def canary_inputs(wildcards):
    kind = wildcards.kind
    image = _image_of("vision" if kind == "vision" else "train")
    # Not ancient: a probe run again (new facts or image) runs the canary again.
    inputs = {"probe": probe_record(image)}
    if image != "bare":
        inputs["container"] = container_image("vision" if kind == "vision" else "train")
    source = canary_source(kind)
    # The data are only what the canary reads: a remade dataset does not rerun it.
    if kind.startswith("train_"):
        inputs["data"] = ancient(training_data(SimpleNamespace(experiment=source)))
        inputs["tokenizer"] = ancient(list(EXPERIMENTS[source].tokenizer_files))
    elif kind == "vision":
        made = bench_vision_inputs(SimpleNamespace(point=source))
    else:
        made = bench_language_inputs(SimpleNamespace(point=source))
    if not kind.startswith("train_"):
        skip = ("container", "preflight")
        inputs.update({k: ancient(v) for k, v in made.items() if k not in skip})
    return inputs


def probe_modules(wildcards):
    """Every module the jobs that run in this image import there."""
    purposes = PROBE_IMAGES[wildcards.image]
    engines = {
        EXPERIMENTS[name].experiment["engine"] for name in _planned_experiments()
    }
    engines |= {
        p["engine"] for p in BENCH_POINTS.values() if p["benchmark"] == "language"
    }
    impls = {
        p.get("model_impl") for p in BENCH_POINTS.values() if p["benchmark"] == "vision"
    }
    # evaluation jobs (evaluate.smk) of the experiments the plan trains
    evaluate = any(name in EVALUATED for name in _planned_experiments())
    modules = []
    for purpose in purposes:
        modules += _probe.image_modules(CLUSTER, purpose, engines, impls, evaluate)
    return list(dict.fromkeys(modules))


def probe_inputs(wildcards):
    sif = _sif(wildcards.image)
    return [sif] if sif else []


def probe_key(wildcards):
    return _probe.probe_key(CLUSTER, wildcards.image, probe_modules(wildcards))


def canary_source_of(wildcards):
    return canary_source(wildcards.kind)


def preflight_partition():
    """The devel partition where the site has one (a short job starts soon), else the GPU
    partition (the probe must see the GPUs)."""
    return CLUSTER.partitions.devel or CLUSTER.partitions.gpu


def preflight_qos(minutes, nodes=1):
    """The site's development QOS for a pre-flight job of ``nodes`` and ``minutes`` (`qos`
    of its resources), where the site has one and the job fits its limits; else nothing:
    the job keeps the profile's QOS (default-resources)."""
    qos = _PREFLIGHT_CLUSTER.devel_qos_for(nodes, minutes)
    return {"qos": qos} if qos else {}


def preflight_resources(rule):
    """The GPU rule's own node as the profile gives it (GPUs, cores, memory), on
    preflight_partition; one node, one task run in the batch shell (as the GPU rules).
    """
    own = _profile_resources.get(rule, {})
    resources = {
        "slurm_partition": preflight_partition(),
        "nodes": 1,
        "tasks": 1,
        "tasks_per_gpu": 0,
        "mpi": "",
        "gres": own.get("gres") or f"gpu:{CLUSTER.gpus_per_node}",
        "cpus_per_task": own.get("cpus_per_task") or CLUSTER.cpus_per_node,
        # As train_segment's own where the profile sets none.
        "mem_mb": own.get("mem_mb") or 4000,
    }
    return resources


def canary_resource(name):
    def get(wildcards):
        return preflight_resources(CANARY_RULE[wildcards.kind.partition("_")[0]])[name]

    return get


def canary_slurm_extra(wildcards):
    """One task per node; Slurm's signal before the time limit as for the segments (their
    SIGUSR2, hpcllm.training.campaign.signal_lead: the launch starts torchrun with it
    ignored, the engine saves on it); SIGTERM for the benchmarks, which save nothing."""
    from hpcllm.training.campaign.signal_lead import SLURM_NAME

    name = SLURM_NAME if wildcards.kind.startswith("train") else "TERM"
    extra = f"--ntasks-per-node=1 --signal={name}@{_canary.TIME['signal_seconds']}"
    return extra + threads_per_core_flag()


def probe_slurm_extra(wildcards):
    return f"--ntasks-per-node=1{threads_per_core_flag()}"


def canary_time_limit_s(wildcards, resources):
    return resources.runtime * 60 * BENCH["run_time_limit_fraction"]


def preflight_targets():
    return []  # made when a GPU job needs them
