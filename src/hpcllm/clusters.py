"""Facts about a cluster, read from ``config/clusters/<name>.yaml``.

One file per cluster says what the site is (GPUs, cores, partitions, container runtime,
the job environment NCCL and PyTorch need there); ``hpcllm.launch`` turns these facts into
the command line of a job. Site facts that are not known for sure are written as a
reference to an environment variable (``gpu: $HPCLLM_GPU_PARTITION``) that the user sets;
``plan_errors`` reports the ones left unset, so the workflow stops before submitting.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hpcllm.offline import OFFLINE_ENV  # part of every cluster's job environment

DEFAULT_ROOT = "config/clusters"

# A whole value that names an environment variable: "$NAME" or "${NAME}".
_ENV_REFERENCE = re.compile(r"^\$(?:\{([A-Za-z_]\w*)\}|([A-Za-z_]\w*))$")
# Any reference to an environment variable inside a value.
VARIABLE = re.compile(r"\$(?:\{([A-Za-z_]\w*)\}|([A-Za-z_]\w*))")

# Caches that default to $HOME, where quota and inode limits break long runs. Each goes to
# a directory under the cluster's scratch space unless the cluster's env sets it itself.
CACHE_DIRS = {
    "HF_HOME": "huggingface",
    "TRITON_CACHE_DIR": "triton",
    "TORCH_EXTENSIONS_DIR": "torch_extensions",
    "XDG_CACHE_HOME": "xdg",
    "HPCLLM_DATA_CACHE": "dataset_index",  # Megatron's --data-cache-path
}

# How a site makes the container images (docs/clusters.md, "Containers"):
# definition: the runtime builds envs/<image>.def (`apptainer build [--fakeroot]`);
# cotainr: cotainr builds a conda environment (envs/<image>.cotainr.yml plus
#   envs/requirements.txt) on the site's base image, where the runtime cannot build;
# copy: the site builds nothing; the image is built elsewhere and copied to
#   containers/<image>.sif, where the workflow takes it as it is.
BUILD_METHODS = ("definition", "cotainr", "copy")


_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_STRING_LIST = {"type": "array", "items": {"type": "string"}}
_PARTITION = {"type": ["string", "null"]}

# The format of a cluster file; docs/clusters.md explains every key.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": [
        "description",
        "scheduler",
        "gpus_per_node",
        "cpus_per_node",
        "partitions",
        "container_runtime",
        "local_storage",
        "scratch",
        "launcher",
    ],
    "properties": {
        "description": {"type": "string"},
        "scheduler": {"enum": ["slurm", "none"]},
        "gpus_per_node": {"type": "integer", "minimum": 0},
        "gpu": {
            "type": ["object", "null"],
            "additionalProperties": False,
            "required": ["vendor", "model", "memory_gb", "peak_bf16_tflops", "peak_fp32_tflops"],
            "properties": {
                "vendor": {"enum": ["nvidia", "amd"]},
                "model": {"type": "string"},
                "memory_gb": {"type": "number", "exclusiveMinimum": 0},
                "peak_bf16_tflops": {"type": "number", "exclusiveMinimum": 0},
                "peak_fp32_tflops": {"type": "number", "exclusiveMinimum": 0},
                "assumed_tflops": {"type": "number", "exclusiveMinimum": 0},
            },
        },
        "cpus_per_node": {"type": "integer", "minimum": 1},
        "threads_per_core": {"type": "integer", "minimum": 1},
        "gpu_cpu_masks": {
            "type": "array",
            "items": {"type": "string", "pattern": "^0x[0-9a-fA-F]+$"},
        },
        "cpu_arch": {"enum": ["x86_64", "aarch64"]},
        "partitions": {
            "type": "object",
            "additionalProperties": False,
            "required": ["gpu", "cpu", "devel"],
            "properties": {"gpu": _PARTITION, "cpu": _PARTITION, "devel": _PARTITION},
        },
        # Why CPU-only jobs hold GPU nodes here (partitions.cpu null), with the source: the
        # plan says it beside the GPU-hours they take.
        "no_cpu_partition": {"type": "string"},
        # A development QOS where a site has one in place of a devel partition: the
        # pre-flight's jobs run in it when they fit its limits (null: not known for sure).
        "devel_qos": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "nodes", "max_minutes"],
            "properties": {
                "name": {"type": "string", "pattern": r"^[A-Za-z0-9_.+-]+$"},
                "nodes": {"type": ["integer", "null"], "minimum": 1},
                "max_minutes": {"type": ["integer", "null"], "minimum": 1},
            },
        },
        "gpu_partition": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "nodes": {"type": ["integer", "null"], "minimum": 1},
                "max_minutes": {"type": ["integer", "null"], "minimum": 1},
            },
        },
        "billing": {
            "type": "object",
            "additionalProperties": False,
            "required": ["gpu_hours_per_node_hour"],
            "properties": {"gpu_hours_per_node_hour": {"type": "number", "exclusiveMinimum": 0}},
        },
        # Whether compute nodes may call sbatch, scontrol requeue and scancel, where it was
        # checked by hand (the site probe's answer wins: hpcllm.training.campaign.chain_site).
        "slurm_from_compute_nodes": {"type": "boolean"},
        # How often a training chain's waiting controller job may ask squeue (seconds).
        "squeue_poll_seconds": {"type": "number", "minimum": 1},
        # The segment's hang watchdog (hpcllm.training.campaign.watchdog): the shortest and
        # longest time without progress before it ends a segment's launch, how often each
        # rank rewrites its heartbeat file. Defaults: WatchdogFacts.
        "watchdog": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "floor_seconds": {"type": "number", "exclusiveMinimum": 0},
                "ceiling_seconds": {"type": "number", "exclusiveMinimum": 0},
                "heartbeat_seconds": {"type": "number", "exclusiveMinimum": 0},
                "straggler_factor": {"type": "number", "exclusiveMinimum": 1},
            },
        },
        "container_runtime": {"enum": ["apptainer", "singularity", "none"]},
        # A Megatron-LM checkout for runs without a container (a workstation, a site whose
        # users work from a module or venv): the training image has it at /opt/Megatron-LM.
        "megatron_lm": {"type": "string", "minLength": 1},
        # Whether the jobs' Megatron has Transformer Engine; unset: NVIDIA images have it,
        # the ROCm image not. false runs Megatron's own layers (--transformer-impl local).
        "transformer_engine": {"type": "boolean"},
        "container_build": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "method": {"enum": list(BUILD_METHODS)},
                "fakeroot": {"type": "boolean"},
                "on_compute_node": {"type": "boolean"},
                "base_image": {"type": "string"},
            },
        },
        "internet": {
            "type": "object",
            "additionalProperties": False,
            "required": ["login", "compute"],
            "properties": {"login": {"type": "boolean"}, "compute": {"type": "boolean"}},
        },
        "container_binds": _STRING_LIST,
        "local_storage": {"type": "string"},
        "scratch": {"type": "string"},
        "env": _STRING_MAP,
        "env_outside_container": _STRING_MAP,
        "env_globs": _STRING_MAP,
        "launcher": {"enum": ["torchrun", "torchrun_jsc"]},
        "rendezvous_suffix": {"type": "string"},
        "srun_args": _STRING_LIST,
        "modules": _STRING_LIST,
    },
}


# The share of the dense peak assumed sustained where a cluster file gives no
# ``gpu.assumed_tflops``: Megatron-LM reports 44-52% for GPT-3 175B-1T on A100s
# (Narayanan et al. 2021, "Efficient large-scale language model training on GPU clusters
# using Megatron-LM", table 1); smaller models and other GPUs reach less.
ASSUMED_FRACTION_OF_PEAK = 0.4
# A GPU partition's longest time limit where its cluster file gives none (the 24 h most
# EuroHPC GPU partitions allow).
DEFAULT_MAX_MINUTES = 1440
# Where the training images hold Megatron-LM (envs/megatron-*.def).
MEGATRON_IN_IMAGE = "/opt/Megatron-LM"


@dataclass(frozen=True)
class Gpu:
    vendor: str  # "nvidia" or "amd"
    model: str
    memory_gb: float  # per GPU (per GCD on AMD MI250X: LUMI counts 8 per node)
    peak_bf16_tflops: float  # dense, per GPU
    peak_fp32_tflops: float  # per GPU, without tensor cores
    # The bf16 rate per GPU a large Megatron run sustains, assumed for time limits and
    # estimates (the cluster file says where it comes from); None: 40% of the peak.
    assumed_tflops: float | None = None

    def rate_tflops(self, precision: str = "bf16") -> float:
        """The assumed sustained TFLOP/s per GPU in ``precision`` (fp32 scaled by peaks)."""
        rate = self.assumed_tflops or ASSUMED_FRACTION_OF_PEAK * self.peak_bf16_tflops
        if precision == "fp32":
            rate *= self.peak_fp32_tflops / self.peak_bf16_tflops
        return rate


@dataclass(frozen=True)
class Partitions:
    gpu: str | None
    cpu: str | None  # None: the site (or a GPU project) has no CPU partition
    devel: str | None  # None: no development partition (some sites use a QOS instead)


@dataclass(frozen=True)
class DevelQos:
    """A site's development QOS (Leonardo's boost_qos_dbg): short jobs of few nodes start
    soon in it, on the devel partition where there is one, else the GPU partition."""

    name: str
    nodes: int | None  # the most nodes a job may ask for in it (None: not known for sure)
    max_minutes: int | None  # its longest time limit (None: not known for sure)

    def allows(self, nodes: int, minutes: int) -> bool:
        """Whether a job of ``nodes`` and a ``minutes`` time limit fits its known limits."""
        return (self.nodes is None or nodes <= self.nodes) and (
            self.max_minutes is None or minutes <= self.max_minutes
        )


@dataclass(frozen=True)
class ContainerBuild:
    method: str = "definition"  # one of BUILD_METHODS
    fakeroot: bool = False  # `build --fakeroot`: sites without root builds need it
    on_compute_node: bool = False  # the site forbids builds on login nodes
    base_image: str = ""  # cotainr's --base-image (the site's own image with ROCm/CUDA)


@dataclass(frozen=True)
class Internet:
    """Which nodes reach the internet (hub downloads, registries, pip)."""

    login: bool = True  # where Snakemake runs: downloads and most image builds
    compute: bool = False  # where the jobs run


# A rank whose heartbeat file has not changed for this many heartbeat intervals has
# stopped reporting (frozen, dead, its node gone); one that still writes it is alive.
SILENT_BEATS = 3


@dataclass(frozen=True)
class WatchdogFacts:
    """How long a segment may go without progress before its watchdog ends it.

    The floor is above NCCL's own 10-minute time-out (ProcessGroupNCCL's default, which
    TORCH_NCCL_ASYNC_ERROR_HANDLING=1 in the GPU sites' env turns into an error): a hung
    collective then fails as ``nccl_error`` with NCCL's message naming the collective,
    and the watchdog covers what that time-out does not see (a rank stopped outside a
    collective, a stuck save or data loader on every rank, gloo, a start-up that never
    reaches the process group). 15 minutes also leaves room for what a measured
    iteration time does not show (the first iteration after a start, an evaluation).
    The ceiling is the bound before anything was measured (the start-up, the first
    segment, the first save): a large job's start (images on hundreds of nodes, loading
    a checkpoint of terabytes, the dataset index check) stays well within an hour, and a
    hang then costs an hour of the job's nodes instead of its whole time limit (4 to 24
    hours). A heartbeat every 10 s is a few hundred bytes per rank on the shared file
    system, and tells a frozen rank from a waiting one within half a minute.

    A rank whose compute per iteration is more than ``straggler_factor`` times the
    median of all ranks' is a straggler, and its node is kept off the next segment
    (hpcllm.training.campaign.stragglers): every rank of a data-parallel job waits for
    the slowest at each gradient all-reduce, so a node 20 % slow costs the whole job 20 %
    of every iteration, while healthy GPUs of one model differ by a few per cent (clock
    and temperature), well below it; a job that excludes a node waits for another.
    """

    floor_seconds: float = 900.0
    ceiling_seconds: float = 3600.0
    heartbeat_seconds: float = 10.0
    straggler_factor: float = 1.2


@dataclass(frozen=True)
class Cluster:
    name: str
    description: str
    scheduler: str  # "slurm" or "none"
    gpus_per_node: int
    gpu: Gpu | None
    cpus_per_node: int  # cores (not hardware threads) usable by jobs
    cpu_arch: str
    partitions: Partitions
    container_runtime: str  # "apptainer", "singularity" or "none" (a bare-metal venv)
    container_build: ContainerBuild
    internet: Internet
    container_binds: tuple[str, ...]
    local_storage: str  # node-local directory; may contain $VARS expanded in the job
    scratch: str  # the project's scratch space; may contain $VARS expanded in the job
    env: dict[str, str]  # the job environment, caches included; $VARS expanded in the job
    env_outside_container: dict[str, str]  # set for srun, removed inside the container
    launcher: str  # "torchrun" or "torchrun_jsc"
    rendezvous_suffix: str  # appended to the first node's name, e.g. "i" for InfiniBand
    srun_args: tuple[str, ...]
    modules: tuple[str, ...]
    # The GPU partition's size and longest time limit (None: not known for sure).
    gpu_partition_nodes: int | None = None
    gpu_partition_max_minutes: int | None = None
    path: str = ""
    # Hardware threads per core that Slurm counts as CPUs: > 1 where a site's Slurm counts
    # them (JSC), so jobs ask --threads-per-core=1 to get cores for their --cpus-per-task.
    threads_per_core: int = 1
    # Per GPU (local rank), the CPU cores nearest to it as a hexadecimal mask: each rank is
    # bound to its GPU's cores (LUMI, JUPITER, JEDI), the srun task to all of them.
    gpu_cpu_masks: tuple[str, ...] = ()
    # Variables the job script sets at start to the newest path matching a glob, for
    # version folders that change with system updates (LUMI's Cray libfabric).
    env_globs: dict[str, str] = field(default_factory=dict)
    # (key, variable) of site facts that name an environment variable that is not set.
    unset: tuple[tuple[str, str], ...] = field(default=())
    # The site's GPU-hours billed per whole-node hour where its unit is not one GPU as
    # gpus_per_node counts them (LUMI bills an MI250X module, 2 GCDs: 4 per node-hour).
    billing_gpu_hours_per_node_hour: float | None = None
    # May compute nodes call sbatch/scontrol requeue/scancel? None: not known (no site
    # document we have says; the site probe answers it).
    slurm_from_compute_nodes: bool | None = None
    # The shortest interval at which the login node's controller asks squeue about a
    # training chain (it backs off while nothing changes; one listing for all
    # experiments). squeue(1): "Do not run squeue or other Slurm client commands that send
    # remote procedure calls to slurmctld from loops in shell scripts or other programs";
    # 30 s is below the Slurm executor plugin's own status checks (about 40 s).
    squeue_poll_seconds: float = 30.0
    # A Megatron-LM checkout where jobs run without a container (None: none given).
    megatron_lm: str | None = None
    # The development QOS the pre-flight's jobs run in (None: the site has none).
    devel_qos: DevelQos | None = None
    # Why CPU-only jobs hold GPU nodes here, with its source (None: not said).
    no_cpu_partition: str | None = None
    # Whether the jobs' Megatron has Transformer Engine (None: by the GPU vendor).
    transformer_engine: bool | None = None
    # The segment's hang watchdog: its floor, ceiling and heartbeat interval.
    watchdog: WatchdogFacts = WatchdogFacts()

    @property
    def uses_slurm(self) -> bool:
        return self.scheduler == "slurm"

    @property
    def uses_containers(self) -> bool:
        return self.container_runtime != "none"

    @property
    def megatron_dir(self) -> str | None:
        """Where the jobs find Megatron-LM: the training image's copy, or the checkout the
        facts name where jobs run without a container (None: no Megatron-LM here)."""
        return MEGATRON_IN_IMAGE if self.uses_containers else self.megatron_lm

    @property
    def cores_per_gpu(self) -> int:
        """Cores per GPU of a node: each rank's share (OMP_NUM_THREADS), at least 1."""
        return max(1, self.cpus_per_node // self.gpus_per_node) if self.gpus_per_node else 1

    def devel_qos_for(self, nodes: int, minutes: int) -> str | None:
        """The development QOS for a job of ``nodes`` and ``minutes`` (None: the site has
        none or the job exceeds its limits; the job then keeps the profile's QOS)."""
        qos = self.devel_qos
        return qos.name if qos is not None and qos.allows(nodes, minutes) else None

    @property
    def max_minutes(self) -> int:
        """The longest time limit of a GPU job here."""
        return self.gpu_partition_max_minutes or DEFAULT_MAX_MINUTES

    @property
    def billed_gpus_per_node(self) -> float:
        """GPU-hours, in the site's billing unit, that one node-hour costs."""
        return self.billing_gpu_hours_per_node_hour or self.gpus_per_node

    @property
    def whole_nodes(self) -> bool:
        """Every Slurm job holds whole GPU nodes: a GPU site without a CPU partition."""
        return self.uses_slurm and self.gpus_per_node > 0 and self.partitions.cpu is None


class ClusterError(ValueError):
    """A cluster file that is missing or wrong; the message says what to fix."""


def known_clusters(root: str | os.PathLike = DEFAULT_ROOT) -> list[str]:
    return sorted(p.stem for p in Path(root).glob("*.yaml"))


def cache_env(scratch: str) -> dict[str, str]:
    """Cache variables pointing under the project's scratch space."""
    base = scratch.rstrip("/") + "/hpcllm-cache"
    return {name: f"{base}/{sub}" for name, sub in CACHE_DIRS.items()}


def _resolve_partition(value: str | None, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The partition name and, if it names an unset environment variable, that variable."""
    if value is None:
        return None, ""
    match = _ENV_REFERENCE.match(value.strip())
    if not match:
        return value, ""
    var = match.group(1) or match.group(2)
    resolved = environ.get(var, "").strip()
    return (resolved or None), ("" if resolved else var)


def load_cluster(
    name: str,
    root: str | os.PathLike = DEFAULT_ROOT,
    environ: Mapping[str, str] | None = None,
) -> Cluster:
    """Read and check ``<root>/<name>.yaml``.

    Partitions written as ``$VAR`` are taken from ``environ`` (default: the process
    environment); unset ones are listed in ``Cluster.unset`` for ``plan_errors``.
    """
    environ = os.environ if environ is None else environ
    path = Path(root) / f"{name}.yaml"
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or not path.is_file():
        known = ", ".join(known_clusters(root)) or "none"
        raise ClusterError(
            f"unknown cluster '{name}': there is no {path}. Known clusters: {known}. "
            "Set `cluster:` in the config (or --config cluster=NAME), or add a file for "
            "the new cluster (see docs/clusters.md)."
        )
    try:
        text = path.read_text()
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ClusterError(f"{path}: not valid YAML: {e}") from e
    twice = duplicate_keys(node)
    if twice:
        raise ClusterError(
            f"{path}: a key given twice (YAML keeps only the last, so a fact would be "
            "silently lost); keep one of each:\n" + "\n".join(f"  {t}" for t in twice)
        )
    # Imported here: jsonschema costs 0.3-0.6 s, and many job scripts import this module
    # without validating a cluster file.
    import jsonschema

    errors = sorted(
        jsonschema.Draft202012Validator(SCHEMA).iter_errors(raw), key=lambda e: list(e.path)
    )
    if errors:
        lines = [
            f"  {'.'.join(str(p) for p in e.absolute_path) or '(top level)'}: {e.message}"
            for e in errors
        ]
        raise ClusterError(
            f"{path} is not a valid cluster file (see docs/clusters.md):\n" + "\n".join(lines)
        )
    build = raw.get("container_build", {})
    if build.get("method") == "cotainr" and not build.get("base_image"):
        raise ClusterError(
            f"{path}: container_build.method is cotainr, which needs container_build.base_image "
            "(the site's base image with its GPU stack, a path or docker://...)"
        )
    gpus = raw["gpus_per_node"]
    if gpus > 0 and not raw.get("gpu"):
        raise ClusterError(f"{path}: gpus_per_node is {gpus} but `gpu:` (type, memory) is missing")
    if gpus == 0 and raw.get("gpu"):
        # Everything GPU-shaped (jobs, sweeps, cost, the default target) counts
        # gpus_per_node, so the GPU section would be silently ignored.
        raise ClusterError(
            f"{path}:{_line(node, 'gpus_per_node')}: gpus_per_node is 0, but the file has a "
            f"`gpu:` section ({raw['gpu'].get('model', 'a GPU')}, line {_line(node, 'gpu')}): "
            "set gpus_per_node to the GPUs (AMD: GCDs) per node, or `gpu: null` for a "
            "cluster without GPUs"
        )

    unset: list[tuple[str, str]] = []
    partitions = {}
    for kind in ("gpu", "cpu", "devel"):
        value, var = _resolve_partition(raw["partitions"][kind], environ)
        partitions[kind] = value
        if var:
            unset.append((f"partitions.{kind}", var))

    masks = tuple(raw.get("gpu_cpu_masks", ()))
    if masks:
        _check_masks(path, masks, gpus, raw["cpus_per_node"], raw.get("srun_args", ()))
    globs = dict(raw.get("env_globs", {}))
    for var, pattern in globs.items():
        if not re.fullmatch(r"/[A-Za-z0-9_./*?-]+", pattern):
            raise ClusterError(
                f"{path}: env_globs.{var} is {pattern!r}; write an absolute path of letters, "
                "digits, _ . / - and the wildcards * ?"
            )
    clash = sorted(set(globs) & set(raw.get("env", {})))
    if clash:
        raise ClusterError(f"{path}: {', '.join(clash)} in both env_globs and env; keep one")
    env = {**cache_env(raw["scratch"]), **OFFLINE_ENV, **raw.get("env", {})}
    watchdog = WatchdogFacts(**raw.get("watchdog", {}))
    if watchdog.floor_seconds > watchdog.ceiling_seconds:
        raise ClusterError(
            f"{path}:{_line(node, 'watchdog')}: watchdog.floor_seconds "
            f"({watchdog.floor_seconds:g}) is above watchdog.ceiling_seconds "
            f"({watchdog.ceiling_seconds:g}); the floor is the shortest bound, the ceiling "
            "the longest: swap them or raise the ceiling"
        )
    if watchdog.floor_seconds <= SILENT_BEATS * watchdog.heartbeat_seconds:
        # A stall must outlast a frozen rank's silence, or it is not told from the waiting.
        raise ClusterError(
            f"{path}:{_line(node, 'watchdog')}: watchdog.floor_seconds "
            f"({watchdog.floor_seconds:g}) must be above {SILENT_BEATS} x "
            f"watchdog.heartbeat_seconds ({watchdog.heartbeat_seconds:g}), the silence after "
            "which a rank counts as stopped: raise the floor or beat more often"
        )
    return Cluster(
        name=name,
        description=raw["description"],
        scheduler=raw["scheduler"],
        gpus_per_node=gpus,
        gpu=Gpu(**raw["gpu"]) if raw.get("gpu") else None,
        cpus_per_node=raw["cpus_per_node"],
        cpu_arch=raw.get("cpu_arch", "x86_64"),
        partitions=Partitions(**partitions),
        container_runtime=raw["container_runtime"],
        container_build=ContainerBuild(**build),
        internet=Internet(**raw.get("internet", {})),
        container_binds=tuple(raw.get("container_binds", ())),
        local_storage=raw["local_storage"],
        scratch=raw["scratch"],
        env=env,
        env_outside_container=dict(raw.get("env_outside_container", {})),
        launcher=raw["launcher"],
        rendezvous_suffix=raw.get("rendezvous_suffix", ""),
        srun_args=tuple(raw.get("srun_args", ())),
        modules=tuple(raw.get("modules", ())),
        gpu_partition_nodes=raw.get("gpu_partition", {}).get("nodes"),
        gpu_partition_max_minutes=raw.get("gpu_partition", {}).get("max_minutes"),
        path=str(path),
        unset=tuple(unset),
        threads_per_core=raw.get("threads_per_core", 1),
        gpu_cpu_masks=masks,
        env_globs=globs,
        billing_gpu_hours_per_node_hour=raw.get("billing", {}).get("gpu_hours_per_node_hour"),
        slurm_from_compute_nodes=raw.get("slurm_from_compute_nodes"),
        squeue_poll_seconds=float(raw.get("squeue_poll_seconds", 30.0)),
        megatron_lm=_resolve_megatron_lm(raw.get("megatron_lm"), path),
        devel_qos=DevelQos(**raw["devel_qos"]) if raw.get("devel_qos") else None,
        no_cpu_partition=raw.get("no_cpu_partition"),
        transformer_engine=raw.get("transformer_engine"),
        watchdog=watchdog,
    )


def _resolve_megatron_lm(value: str | None, path: Path) -> str | None:
    """The checkout as an absolute path: ~ and $VARS expanded, a relative path taken from
    the working directory (the workflow's, as Snakemake takes paths)."""
    if value is None:
        return None
    return str(Path(os.path.expandvars(os.path.expanduser(value))).resolve())


def duplicate_keys(node, path: tuple = ()) -> list[str]:
    """``key.path (lines 3 and 9)`` for each key given twice in one mapping of a composed
    YAML document (PyYAML keeps the last value without a word). Merge keys (``<<``) may
    repeat what they merge."""
    found: list[str] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            if key.tag == "tag:yaml.org,2002:merge":
                continue
            name, line = str(key.value), key.start_mark.line + 1
            if name in seen:
                where = ".".join(map(str, (*path, name)))
                found.append(f"{where} (lines {seen[name]} and {line})")
            seen.setdefault(name, line)
            found += duplicate_keys(value, (*path, name))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found += duplicate_keys(item, (*path, i))
    return found


def _line(node, key: str) -> int | str:
    """The line of a top-level ``key`` of a composed YAML document ("?" if not there)."""
    for k, _ in getattr(node, "value", ()):
        if getattr(k, "value", None) == key:
            return k.start_mark.line + 1
    return "?"


def _check_masks(path, masks, gpus: int, cpus: int, srun_args) -> None:
    """One mask per GPU, disjoint, each with the node's cores per GPU; srun gets their
    union as its binding, so srun_args must not bind too."""
    where = f"{path}: gpu_cpu_masks"
    if len(masks) != gpus:
        raise ClusterError(f"{where} has {len(masks)} masks for {gpus} GPUs per node: one per GPU")
    values = [int(m, 16) for m in masks]
    per_gpu = cpus // gpus
    for mask, value in zip(masks, values, strict=True):
        if value.bit_count() != per_gpu:
            raise ClusterError(
                f"{where}: {mask} holds {value.bit_count()} cores, but cpus_per_node / "
                f"gpus_per_node is {per_gpu}"
            )
    if sum(values) != _union(values):
        raise ClusterError(f"{where}: masks overlap; each core belongs to one GPU")
    if any(a.startswith(("--cpu-bind", "--cpu_bind")) for a in srun_args):
        raise ClusterError(
            f"{path}: srun_args binds CPUs and gpu_cpu_masks are given; drop the --cpu-bind "
            "of srun_args (the launch binds the task to the masks' cores)"
        )


def _union(values) -> int:
    out = 0
    for v in values:
        out |= v
    return out


def plan_errors(cluster: Cluster) -> list[str]:
    """What must be set before jobs can be submitted to ``cluster`` (empty when nothing)."""
    return [
        f"{cluster.path}: {key} is not known for sure for {cluster.description} and is "
        f"taken from ${var}, which is not set. Find the name with `sinfo -s` or the site's "
        f"documentation and `export {var}=<name>`."
        for key, var in cluster.unset
    ]


# What the value is, and the command that shows it (kept apart: one pair of backticks each).
_VALUE_HINTS = {
    "slurm_account": ("your project's compute-time account", "sacctmgr show assoc user=$USER"),
    "slurm_partition": ("the partition's name", "sinfo -s"),
}


def profile_errors(
    resources: Mapping[str, Mapping[str, object]], environ: Mapping[str, str] | None = None
) -> list[str]:
    """Profile resources that name an unset environment variable.

    ``resources`` maps "default-resources" or a rule name to the resources' raw values as
    the profile wrote them. Snakemake leaves an unset ``$VAR`` as literal text, which Slurm
    would then be asked for (``--account=$HPCLLM_ACCOUNT``).
    """
    environ = os.environ if environ is None else environ
    errors = []
    for scope, values in resources.items():
        where = scope if scope == "default-resources" else f"set-resources of rule {scope}"
        for name, raw in values.items():
            if not isinstance(raw, str):
                continue
            what, command = _VALUE_HINTS.get(name, ("the value", None))
            find = f" (find it with `{command}`)" if command else ""
            unset = False
            for match in VARIABLE.finditer(raw):
                var = match.group(1) or match.group(2)
                if environ.get(var, "").strip():
                    continue
                unset = True
                errors.append(
                    f"the profile's {where} takes {name} from ${var}, which is not set: "
                    f"`export {var}=<{what}>` before running snakemake{find}"
                )
            if unset or name not in _NAME_PATTERNS:
                continue
            value = _as_snakemake_reads(
                VARIABLE.sub(lambda m: environ.get(m.group(1) or m.group(2), ""), raw)
            )
            problem = slurm_name_problem(name, value.strip())
            if problem:
                variables = [m.group(1) or m.group(2) for m in VARIABLE.finditer(raw)]
                source = f" from ${variables[0]}" if variables else ""
                fix = (
                    f"`export {variables[0]}=<{what}>`"
                    if variables
                    else f"set {name} in the profile to {what}"
                )
                errors.append(
                    f"the profile's {where} takes {name}{source}, which is {value!r}: "
                    f"{problem}; {fix}{find}"
                )
    return errors


# What Slurm takes as one account (the plugin splits at commas and whitespace and submits
# with the first part only: "proj1\nproj2" would run as proj1) and as partitions (a
# comma-separated list is Slurm's own "any of these").
_NAME = r"[A-Za-z0-9_.+-]+"
_NAME_PATTERNS = {
    "slurm_account": (re.compile(_NAME), "an account is one name"),
    "slurm_partition": (
        re.compile(rf"{_NAME}(,{_NAME})*"),
        "partitions are names (a list: commas)",
    ),
}


def _as_snakemake_reads(value: str) -> str:
    """A resource's text as Snakemake takes it: a Python expression where it is one
    (``"'all'"`` is all: `all` alone is a builtin), else the text itself."""
    import ast

    try:
        read = ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value
    return str(read) if isinstance(read, (str, int)) else value


def profile_resource(
    resources: Mapping[str, Mapping[str, object]],
    rule: str,
    name: str,
    environ: Mapping[str, str] | None = None,
) -> object | None:
    """The resource ``name`` the profile gives ``rule`` (its set-resources, else
    default-resources; ``resources`` as for profile_errors), its variables expanded and
    read as Snakemake reads it; None where the profile gives none."""
    environ = os.environ if environ is None else environ
    for scope in (rule, "default-resources"):
        raw = resources.get(scope, {}).get(name)
        if raw is None:
            continue
        if not isinstance(raw, str):
            return raw
        return _as_snakemake_reads(
            VARIABLE.sub(lambda m: environ.get(m.group(1) or m.group(2), ""), raw)
        )
    return None


def slurm_name_problem(name: str, value: str) -> str | None:
    """Why ``value`` cannot be the Slurm resource ``name`` (slurm_account, slurm_partition)
    as given, or None."""
    pattern, what = _NAME_PATTERNS[name]
    if pattern.fullmatch(value):
        return None
    if not value:
        return "it is empty"
    bad = sorted({c for c in value if not re.fullmatch(r"[A-Za-z0-9_.+,-]", c)} or {","})
    shown = ", ".join(repr(c) for c in bad)
    return f"{what} of letters, digits and _ . + -, without {shown}"


@dataclass(frozen=True)
class ProfileCluster:
    """The cluster a Snakemake profile names (its ``config: cluster:``), and whether the
    command line names one itself (``--config cluster=NAME``)."""

    profile: str  # the profile's config file
    cluster: str | None
    command_line_cluster: str | None


_PROFILE_FILES = ("config.v9+.yaml", "config.v8+.yaml", "config.yaml")


def _profile_file(value: str, roots: list[str]) -> Path | None:
    candidates = [Path(value)] if os.path.isabs(value) else [Path(r) / value for r in roots]
    candidates += [
        Path(base) / "snakemake" / value
        for base in (
            os.environ.get("XDG_CONFIG_HOME", os.path.expanduser("~/.config")),
            "/etc/xdg",
        )
    ]
    for folder in candidates:
        for name in _PROFILE_FILES:
            if (folder / name).is_file():
                return folder / name
    return None


def profile_cluster(
    argv: list[str], environ: Mapping[str, str] | None = None, roots: list[str] | None = None
) -> ProfileCluster | None:
    """What the command line's profile (``--profile`` or $SNAKEMAKE_PROFILE) says the
    cluster is; None without a profile.

    Snakemake replaces a profile's ``config:`` by a ``--config`` given on the command line
    (it does not merge them), so ``--profile profiles/juwels --config max_gpu_hours=1000``
    would otherwise plan for the configuration file's cluster (``local``) with JUWELS'
    resources. The workflow reads the profile's cluster here instead.
    """
    environ = os.environ if environ is None else environ
    roots = roots or [os.getcwd()]
    profile, config_args, i = environ.get("SNAKEMAKE_PROFILE"), [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--profile" and i + 1 < len(argv):
            profile, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--profile="):
            profile = arg.split("=", 1)[1]
        elif arg in ("--config", "-C"):
            i += 1
            while i < len(argv) and not argv[i].startswith("-"):
                config_args.append(argv[i])
                i += 1
            continue
        i += 1
    command_line = next((a.split("=", 1)[1] for a in config_args if a.startswith("cluster=")), None)
    if not profile:
        return None
    path = _profile_file(profile, roots)
    if path is None:
        return None
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return None
    config = raw.get("config") or {}
    if isinstance(config, list):  # `config: ["cluster=juwels"]`
        config = dict(str(item).split("=", 1) for item in config if "=" in str(item))
    cluster = config.get("cluster") if isinstance(config, dict) else None
    return ProfileCluster(str(path), cluster, command_line)


def cluster_from_profile(
    config_cluster: str, found: ProfileCluster | None
) -> tuple[str, str | None]:
    """(the cluster to plan for, a note to print or None); raises ClusterError for a
    command line that names another cluster than its profile."""
    if found is None or not found.cluster or config_cluster == found.cluster:
        return config_cluster, None
    if found.command_line_cluster is not None:
        if found.command_line_cluster == config_cluster:
            raise ClusterError(
                f"--config cluster={config_cluster} on the command line, but the profile "
                f"{found.profile} is for cluster '{found.cluster}' (its resources, "
                f"partitions and account): use --profile profiles/{config_cluster} (or "
                f"drop cluster= from --config)."
            )
        return config_cluster, None
    return found.cluster, (
        f"cluster: {found.cluster} (from {found.profile}; a --config on the command line "
        "replaces the profile's config:, so the workflow reads the cluster from the "
        "profile)"
    )


def check_configfile_cluster(
    configfiles, found: ProfileCluster | None, roots: list[str] | None = None
) -> None:
    """Raise ClusterError for a --configfile that names another cluster than the profile.

    The profile's ``config: cluster:`` is a --config, which wins over every --configfile:
    ``cluster: lumi`` in a file given with ``--profile profiles/juwels`` would be ignored
    without a word, and the plan made for JUWELS. Files are read relative to ``roots``
    (default: the working directory), as Snakemake read them; the last file naming a
    cluster is the one Snakemake would have taken.
    """
    if found is None or not found.cluster:
        return
    named = None
    for raw in configfiles or ():
        candidates = [Path(raw)] if os.path.isabs(raw) else [Path(r) / raw for r in roots or ["."]]
        path = next((p for p in candidates if p.is_file()), None)
        try:
            data = yaml.safe_load(path.read_text()) if path else None
        except (OSError, yaml.YAMLError):
            continue  # Snakemake has read it already, or says why it cannot
        if isinstance(data, dict) and isinstance(data.get("cluster"), str):
            named = (str(raw), data["cluster"])
    if named is None or named[1] == found.cluster:
        return
    file, cluster = named
    raise ClusterError(
        f"{file} sets cluster: {cluster}, but the profile {found.profile} is for cluster "
        f"'{found.cluster}' (its resources, partitions and account), and a profile's "
        f"`config: cluster:` wins over a --configfile: the plan would be made for "
        f"{found.cluster}. Use --profile profiles/{cluster} to run on {cluster}, or remove "
        f"`cluster: {cluster}` from {file} to run on {found.cluster}."
    )


def variable_in_path(key: str, value: str | None) -> str | None:
    """Why a path that names an environment variable cannot be used, or None.

    Snakemake takes such a path literally (a file named ``$SCRATCH/...`` that never
    exists), while the job's launch script would expand it: the two would disagree.
    """
    if not isinstance(value, str):
        return None
    match = VARIABLE.search(value)
    if match is None:
        return None
    return (
        f"{key}: '{value}' names the environment variable {match.group(0)}, which the "
        "workflow does not expand (only the job's launch script would): write the path "
        "out, e.g. with the variable's value"
    )
