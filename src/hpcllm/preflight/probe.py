"""The site probe: what the plan assumes of a site, checked on one of its GPU nodes.

One small job per site and image (the ``site_probe`` rule) runs :func:`run_probe` on a
node of the devel partition (else the GPU partition: the GPUs must be seen), in the
site's development QOS where it has one (``devel_qos``). Each check
returns a record ``{check, ok, detail}``; ``ok`` says whether the site is as the facts
file (``config/clusters/<name>.yaml``) and the plan assume. The answers, with the date,
the job id and the host, are written as JSON where later plans read them; a probe with a
failed check fails its job, naming the checks, so nothing that depends on it starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from hpcllm.clusters import profile_resource
from hpcllm.launch import RUNTIME_EXEC, Launch, container_exec, package_in_container, python_for

# Megatron-LM's folder (the image's, or the facts' checkout: Cluster.megatron_dir) is first
# on sys.path of the inside check, as pretrain_gpt.py's folder is for the job's program.
LAUNCHER_MODULE = {"torchrun": "torch.distributed.run", "torchrun_jsc": "torchrun_jsc"}


# The probe job's time limit in minutes.
RUNTIME_MIN = 15


class ProbeFailed(RuntimeError):
    """A check found the site other than the plan assumes."""


def check(name: str, ok: bool, detail: str) -> dict[str, Any]:
    return {"check": name, "ok": bool(ok), "detail": detail}


def image_modules(
    cluster,
    purpose: str,
    engines: set[str] = frozenset(),
    vision_impls: set[str] = frozenset(),
    evaluate: bool = False,
) -> list[str]:
    """Every module the jobs of ``purpose`` ("train": training segments and language
    points, and the evaluation jobs where the plan ``evaluate``s; "vision") import in the
    image, for the ``engines`` they run."""
    from hpcllm.models.megatron_args import transformer_impl_for

    modules = ["torch", LAUNCHER_MODULE[cluster.launcher]]
    if purpose == "vision":
        modules += ["numpy", "PIL", "lmdb", "hpcllm.bench.vision_train"]
        if "torchvision" in vision_impls:
            modules.append("torchvision")
        return modules
    if "megatron" in engines:
        # pretrain_gpt.py imports these; helpers_cpp is the compiled dataset helpers
        # (built with the image; without it rank 0 compiles them at start-up, or fails);
        # TensorBoard for --tensorboard-dir; the Hugging Face tokenizer.
        modules += [
            "megatron.core",
            "megatron.training",
            "megatron.core.datasets.helpers_cpp",
            "tensorboard",
            "tokenizers",
            "transformers",
        ]
        if transformer_impl_for(cluster) == "transformer_engine":
            # and its fused Adam: without one a distributed-optimizer campaign cannot
            # resume (megatron_args.as_run drops it where Megatron runs without TE)
            modules += ["transformer_engine", "transformer_engine.pytorch.optimizers"]
    if "torch" in engines:  # hpcllm's own engine, from the checkout's src/
        modules += ["tensorboard", "tokenizers", "hpcllm.training.engines.torch_engine"]
    if evaluate:  # evaluate_tasks and evaluate_perplexity run in the training image
        modules += ["lm_eval", "transformers", "hpcllm.evaluation.run"]
    return list(dict.fromkeys(modules))


def facts_of(cluster) -> dict[str, Any]:
    """The cluster's facts as loaded (environment references unexpanded), without where
    they were read from and the plan's notes (no job checks them)."""
    facts = dataclasses.asdict(cluster)
    facts.pop("path", None)
    facts.pop("no_cpu_partition", None)
    return facts


def key_of(what: dict[str, Any]) -> str:
    text = json.dumps(what, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def record_path(cluster_name: str, image: str) -> str:
    """Where the probe of ``image`` (``bare`` without a container) records its answers;
    read by later plans and the chain (hpcllm.training.campaign.chain_site)."""
    return f"results/preflight/{cluster_name}/probe/{image}.json"


def probe_key(cluster, image: str, modules: list[str]) -> str:
    """What the probe checks: the site facts, the image, its modules and the Megatron-LM
    commit. A param of the rule, so that Snakemake reruns the probe exactly when one
    changes (the image file itself is an input)."""
    from hpcllm.models.megatron_args import MEGATRON_LM_COMMIT

    return key_of(
        {
            "facts": facts_of(cluster),
            "image": Path(image).name,
            "modules": modules,
            "megatron_commit": MEGATRON_LM_COMMIT,
        }
    )


def _run(argv: list[str], timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)


def _tail(text: str, lines: int = 5) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])


def _tool_output(argv: list[str]) -> tuple[str | None, str]:
    """A node tool's stdout, or None and why it failed (not found, timed out, an error)."""
    try:
        proc = _run(argv, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{argv[0]}: {e}"
    if proc.returncode != 0:
        return None, f"{' '.join(argv)} failed ({proc.returncode}): {_tail(proc.stderr)}"
    return proc.stdout, ""


def check_runtime(cluster) -> dict[str, Any]:
    if not cluster.uses_containers:
        return check(
            "container_runtime",
            True,
            f"none ({cluster.path}: container_runtime: none): the jobs run in the "
            "workflow's environment",
        )
    exe = RUNTIME_EXEC[cluster.container_runtime]
    path = shutil.which(exe)
    if not path:
        return check(
            "container_runtime",
            False,
            f"{exe} is not on the compute node's PATH ({cluster.path}: container_runtime "
            f"{cluster.container_runtime}); load its module (modules:) or fix the facts",
        )
    try:
        proc = _run([exe, "--version"], timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return check("container_runtime", False, f"{path} --version: {e}")
    version = (proc.stdout or proc.stderr).strip().splitlines()
    return check(
        "container_runtime",
        proc.returncode == 0,
        f"{path}: {version[0] if version else ''} (exit {proc.returncode})",
    )


def inside_launch(cluster, image: str, modules: list[str]) -> Launch:
    """The image started as the jobs start it (binds, the job environment, the variables
    kept outside), running :mod:`hpcllm.preflight.inside` with the checkout's src/."""
    binds, env = package_in_container(image)
    unset = tuple(cluster.env_outside_container)
    # Without a container: this environment, with the checkout the facts name, if any.
    megatron = cluster.megatron_dir
    inside = [
        python_for(image if cluster.uses_containers else None),
        "-m", "hpcllm.preflight.inside",
        *(["--sys-path", megatron] if megatron else []),
        *modules,
    ]  # fmt: skip
    argv = (
        container_exec(cluster, image, binds, unset) if cluster.uses_containers else []
    ) + inside
    return Launch(
        argv=argv,
        env={**cluster.env, **cluster.env_outside_container, **env},
        modules=cluster.modules,
        source=cluster.path or cluster.name,
        unset_in_container=unset,
        globs=cluster.env_globs,
    )


def check_image(cluster, image: str, modules: list[str]) -> tuple[list[dict], dict | None]:
    """The image starts; every module imports in it. Also returns what it reported."""
    launch = inside_launch(cluster, image, modules)
    try:
        proc = _run(["bash", "-c", launch.shell()], timeout=600)
    except subprocess.TimeoutExpired:
        return [check("image_start", False, f"{image} did not start within 600 s")], None
    inside = None
    for line in reversed(proc.stdout.splitlines()):
        try:
            inside = json.loads(line)
            break
        except ValueError:
            continue
    if proc.returncode != 0 or not isinstance(inside, dict):
        detail = f"{image} did not start (exit {proc.returncode}): {_tail(proc.stderr)}"
        return [check("image_start", False, detail)], None
    found = [check("image_start", True, f"{image}: Python {inside['python']}")]
    for name, error in inside["modules"].items():
        found.append(check(f"module {name}", error is None, error or "imports"))
    return found, inside


_NVIDIA = re.compile(r"^GPU \d+: (.+?) \(UUID")
_AMD = re.compile(r"GPU\[(\d+)\].*Card (?:series|model)\s*:\s*(.+)$")


def gpu_names(vendor: str) -> tuple[list[str] | None, str]:
    """The node's GPUs as nvidia-smi / rocm-smi lists them (None: the tool failed)."""
    argv = ["nvidia-smi", "-L"] if vendor == "nvidia" else ["rocm-smi", "--showproductname"]
    out, failed = _tool_output(argv)
    if out is None:
        return None, failed
    if vendor == "nvidia":
        names = [m.group(1) for line in out.splitlines() if (m := _NVIDIA.match(line))]
    else:
        by_index = {}
        for line in out.splitlines():
            m = _AMD.search(line)
            if m:
                by_index.setdefault(m.group(1), m.group(2).strip())
        names = list(by_index.values())
    return names, " ".join(argv)


def check_gpus(cluster) -> dict[str, Any]:
    """The GPUs visible and their type, against gpus_per_node and gpu.model."""
    names, how = gpu_names(cluster.gpu.vendor)
    if names is None:
        return check("gpus", False, how)
    # The model's family (A100, H100, GH200, MI250X) in the name the tool prints.
    family = re.split(r"[-\s]", cluster.gpu.model)[0].lower()
    wrong = [n for n in names if family not in n.lower()]
    ok = len(names) == cluster.gpus_per_node and not wrong
    detail = (
        f"{how}: {len(names)} x {', '.join(sorted(set(names))) or 'none'}; the facts "
        f"({cluster.path}): {cluster.gpus_per_node} x {cluster.gpu.model}"
    )
    return check("gpus", ok, detail)


PCI_DEVICES = "/sys/bus/pci/devices"


def _cores(text: str) -> set[int]:
    """The cores of a Linux CPU list ("0-71", "0-3,8-11")."""
    cores: set[int] = set()
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cores.update(range(int(first), int(last or first) + 1))
    return cores


def _ranges(cores: set[int]) -> str:
    """``cores`` as a CPU list: 0-71,144-215."""
    runs: list[list[int]] = []
    for c in sorted(cores):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "none"


def gpu_local_cores(sysfs: str = PCI_DEVICES) -> tuple[list[set[int]] | None, str]:
    """Per GPU in nvidia-smi's order (PCI order), the cores Linux lists as local to it
    (its PCI device's local_cpulist; None: the tool or the file failed)."""
    argv = ["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"]
    out, failed = _tool_output(argv)
    if out is None:
        return None, failed
    local = []
    for line in out.splitlines():
        if not line.strip():
            continue
        try:
            bus = line.split(",")[1].strip()  # 00000009:01:00.0; sysfs: 0009:01:00.0
            domain, rest = bus.split(":", 1)
            path = Path(sysfs) / f"{int(domain, 16):04x}:{rest.lower()}" / "local_cpulist"
            local.append(_cores(path.read_text()))
        except (OSError, ValueError, IndexError) as e:
            return None, f"{' '.join(argv)} said {line.strip()!r}: {e}"
    return local, " ".join(argv)


def check_gpu_cores(cluster, sysfs: str = PCI_DEVICES) -> dict[str, Any]:
    """Each rank's cores (gpu_cpu_masks[i]: local rank i drives CUDA device i, in PCI
    order) among the cores local to GPU i. The facts' pairing of GPU index and chip is
    not documented for every site (JUPITER, JEDI): a mask on another chip's cores would
    put every rank's threads away from its GPU and memory, so the GPU jobs wait for it."""
    local, how = gpu_local_cores(sysfs)
    if local is None:
        return check("gpu_cpu_masks", False, how)
    wrong = []
    for i, mask in enumerate(cluster.gpu_cpu_masks):
        value = int(mask, 16)
        cores = {c for c in range(value.bit_length()) if value >> c & 1}
        near = local[i] if i < len(local) else set()
        if not cores or not cores <= near:
            wrong.append(f"GPU {i}: the mask's cores {_ranges(cores)}, its own {_ranges(near)}")
    detail = f"{how} and each GPU's local_cpulist: " + (
        "; ".join(wrong) if wrong else f"every mask within its GPU's cores ({len(local)} GPUs)"
    )
    if wrong:
        detail += (
            f". Put each GPU's cores in gpu_cpu_masks of {cluster.path}, in GPU order (or "
            "remove the masks and set srun_args: [--cpu-bind=none] to run unbound)"
        )
    return check("gpu_cpu_masks", not wrong, detail)


def check_network(cluster, inside: dict | None) -> dict[str, Any]:
    """The network NCCL/RCCL is told to use (NCCL_NET) is there: InfiniBand's devices on
    the node and libibverbs in the image, or the named plugin library in the image."""
    net = cluster.env.get("NCCL_NET")
    if not net:
        return check("network_plugin", True, "NCCL_NET is not set: NCCL picks its network")
    if inside is None:
        return check("network_plugin", False, f"NCCL_NET={net}: the image did not start")
    if net == "IB":
        devices = (
            sorted(os.listdir("/sys/class/infiniband"))
            if os.path.isdir("/sys/class/infiniband")
            else []
        )
        ok = bool(devices) and bool(inside.get("ibverbs"))
        return check(
            "network_plugin",
            ok,
            f"NCCL_NET=IB: InfiniBand devices {devices or 'none'} on the node, libibverbs "
            f"{inside.get('ibverbs') or 'missing'} in the image",
        )
    plugins = inside.get("net_plugins") or []
    return check(
        "network_plugin",
        bool(plugins),
        f"NCCL_NET={net}: plugin libraries on the image's LD_LIBRARY_PATH: "
        f"{', '.join(plugins) or 'none'}",
    )


def check_storage(name: str, path: str, where: str) -> dict[str, Any]:
    """``path`` (a facts value; $VARS expanded here, in the job) is writable; free space."""
    expanded = os.path.expandvars(path)
    if "$" in expanded:
        return check(name, False, f"{path}: a variable is not set in the job ({where})")
    try:
        with tempfile.NamedTemporaryFile(dir=expanded, prefix=".hpcllm-probe-") as f:
            f.write(b"\0" * (1 << 20))
            f.flush()
            os.fsync(f.fileno())
        free = shutil.disk_usage(expanded).free
    except OSError as e:
        return check(name, False, f"{expanded} ({where}) is not writable: {e}")
    return check(name, True, f"{expanded}: writable, {free / 1e9:.1f} GB free")


def hub_host() -> str:
    """The Hugging Face hub's host (HF_ENDPOINT, else huggingface_hub's default)."""
    endpoint = os.environ.get("HF_ENDPOINT")
    if not endpoint:
        from huggingface_hub import constants

        endpoint = constants.ENDPOINT
    return urlparse(endpoint).hostname or endpoint


def reaches(host: str, port: int = 443, timeout: float = 5.0) -> tuple[bool, str]:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True, f"connected to {host}:{port}"
    except OSError as e:
        return False, f"{host}:{port}: {e}"


def check_internet(cluster) -> dict[str, Any]:
    """What the node reaches (the hub) against the facts' internet.compute."""
    reached, how = reaches(hub_host())
    expected = cluster.internet.compute
    if reached == expected:
        return check("internet", True, f"{how}; as the facts say (internet.compute: {expected})")
    if reached:  # more than assumed: harmless, the jobs run offline anyway
        return check(
            "internet",
            True,
            f"{how}, though the facts say internet.compute: false (the jobs run offline "
            f"anyway; {cluster.path} may say true)",
        )
    return check(
        "internet",
        False,
        f"{how}, but the facts say internet.compute: true; set it to false in {cluster.path}",
    )


def _job_field(job: str, field: str) -> str | None:
    try:
        text = _run(["scontrol", "show", "job", "-o", job], timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(rf"(?:^|\s){field}=(\S+)", text)
    return m.group(1) if m and m.group(1) != "(null)" else None


# The probe's ``submit`` options: their sbatch flags and the profile resources they are.
# A GPU and the cores as train_segment's own: a site may refuse a GPU-partition job
# without --gres, which must not read as "compute nodes may not call sbatch".
SUBMIT_FLAGS = {
    "partition": "--partition",
    "account": "--account",
    "qos": "--qos",
    "gres": "--gres",
    "cpus_per_task": "--cpus-per-task",
}
_SUBMIT_RESOURCES = {
    "partition": "slurm_partition",
    "account": "slurm_account",
    "qos": "qos",
    "gres": "gres",
    "cpus_per_task": "cpus_per_task",
}


def submit_options(
    cluster, resources: Mapping[str, Mapping[str, Any]], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The partition, account, QOS, GPUs (gres) and cores per task the profile gives
    train_segment, whose chain jobs submit their successors from compute nodes
    (``resources`` as for hpcllm.clusters.profile_errors): the probe's sbatch test asks for
    the same, so that its answer is about the site's policy, not about a missing QOS or
    GPU, or the probe's own development partition or QOS. Where the profile gives no gres
    or cores: the node's, as the pre-flight jobs take them
    (workflow/rules/preflight_functions.smk, preflight_resources)."""
    found = {
        key: profile_resource(resources, "train_segment", name, environ)
        for key, name in _SUBMIT_RESOURCES.items()
    }
    found["partition"] = found["partition"] or cluster.partitions.gpu
    gpus = getattr(cluster, "gpus_per_node", 0) or 0
    found["gres"] = found["gres"] or (f"gpu:{gpus}" if gpus else None)
    found["cpus_per_task"] = found["cpus_per_task"] or getattr(cluster, "cpus_per_node", None)
    return {key: str(value) for key, value in found.items() if value}


def submit_test_argv(options: Mapping[str, str | None]) -> tuple[list[str], list[str]]:
    """The probe's sbatch line (without its ``--wrap``) for ``options`` (submit_options'
    keys), and the flags of those options alone (for the answer's words)."""
    # Held, and to begin in an hour besides: it must stay pending until it is cancelled
    # (a test cluster once ran a job submitted with SBATCH_HOLD at once).
    argv = ["sbatch", "--hold", "--begin", "now+3600", "--parsable", "--job-name",
            "hpcllm-probe-submit", "--time", "1", "--nodes", "1",
            "--output", "/dev/null"]  # fmt: skip
    given = []
    for key, flag in SUBMIT_FLAGS.items():
        if options.get(key):
            given += [flag, str(options[key])]
    return argv + given, given


def check_slurm_from_node(submit: dict[str, str] | None = None) -> dict[str, Any]:
    """Whether this compute node may call sbatch, scontrol requeue and scancel (a chain's
    jobs submit their successors where it may, hpcllm.training.campaign.chain_site): a held
    one-minute job submitted, requeued (Slurm answers "pending execution" to an allowed
    requeue of a pending job) and cancelled. An answer, not a failure: where the node may
    not, a chain is submitted up front from the login node. ``allowed`` holds it.

    ``submit``: the partition, account, QOS, GPUs and cores the chain's jobs get (the
    profile's train_segment: submit_options), so that a refusal is about submitting from a
    compute node, not about a missing QOS or GPU or the probe's own development QOS.
    Without it: the probe's own partition and account."""
    from hpcllm.launch import clean_environment

    env = clean_environment(os.environ)
    options = dict(submit or {})
    job = os.environ.get("SLURM_JOB_ID")
    if submit is None and job:
        for field, key in (("Partition", "partition"), ("Account", "account")):
            options[key] = _job_field(job, field)
    argv, given = submit_test_argv(options)
    answers, allowed = [], True
    try:
        proc = _run([*argv, "--wrap", "true"], env=env, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        proc = subprocess.CompletedProcess(argv, 1, "", str(e))
    submitted = proc.stdout.strip().split(";")[0] if proc.returncode == 0 else ""
    asked = f" {' '.join(given)}" if given else ""
    if not submitted:
        allowed = False
        answers.append(f"sbatch{asked} refused ({_tail(proc.stderr or proc.stdout)})")
    else:
        answers.append(f"sbatch{asked}: job {submitted} (held)")
        try:
            requeue = _run(["scontrol", "requeue", submitted], env=env, timeout=60)
            said = (requeue.stderr + requeue.stdout).strip()
            ok = requeue.returncode == 0 or "pending execution" in said.lower()
        except (OSError, subprocess.TimeoutExpired) as e:
            ok, said = False, str(e)
        allowed &= ok
        answers.append("scontrol requeue: allowed" if ok else f"scontrol requeue refused ({said})")
        try:
            cancel = _run(["scancel", submitted], env=env, timeout=60)
            ok, said = cancel.returncode == 0, _tail(cancel.stderr)
        except (OSError, subprocess.TimeoutExpired) as e:
            ok, said = False, str(e)
        allowed &= ok
        answers.append("scancel: allowed" if ok else f"scancel refused ({said})")
    detail = "; ".join(answers)
    if not allowed:
        detail += (
            "; a chain of training jobs (training.chain) is submitted up front from the "
            "login node here"
        )
    return {**check("slurm_from_compute_node", True, detail), "allowed": allowed}


def check_resiliency(inside: dict | None) -> dict[str, Any]:
    """Which of the engines' own resiliency features the image has (an answer, not a
    failure: the segment watchdog covers every engine without them); the segments use
    what it found (hpcllm.models.megatron_resiliency)."""
    from hpcllm.models.megatron_resiliency import ImageResiliency

    found = ImageResiliency.from_inside(inside)
    return check("resiliency", True, found.describe())


def probe_record(
    cluster, image: str, key: str, checks: list[dict], inside: dict | None, **more: Any
) -> dict[str, Any]:
    """The probe's record of ``checks`` run here now (``more``: further answers)."""
    return {
        "cluster": cluster.name,
        "image": image,
        "key": key,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "host": socket.gethostname(),
        "ok": all(c["ok"] for c in checks),
        "checks": checks,
        "inside": inside,  # what the image reported (torch version, ...), read by plans
        **more,
    }


def run_probe(
    cluster,
    image: str,
    modules: list[str],
    key: str,
    record_path: str | os.PathLike,
    answers_path: str | os.PathLike,
    submit: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run every check; write the answers to ``answers_path`` (always) and, when every
    check passed, the record ``record_path`` (the rule's output); else ProbeFailed.
    ``submit``: the sbatch options of the chain's jobs (check_slurm_from_node)."""
    from hpcllm.atomic import atomic_path

    checks = [check_runtime(cluster)]
    image_checks, inside = check_image(cluster, image, modules)
    checks += image_checks
    if cluster.gpu is not None:
        checks.append(check_gpus(cluster))
        if cluster.gpu_cpu_masks and cluster.gpu.vendor == "nvidia":
            checks.append(check_gpu_cores(cluster))
    checks.append(check_network(cluster, inside))
    checks.append(check_storage("local_storage", cluster.local_storage, cluster.path))
    checks.append(check_storage("scratch", cluster.scratch, cluster.path))
    checks.append(check_internet(cluster))
    slurm = check_slurm_from_node(submit)
    checks.append(slurm)
    checks.append(check_resiliency(inside))
    # read by plans and the chain (hpcllm.training.campaign.chain_site)
    record = probe_record(cluster, image, key, checks, inside,
                          slurm_from_compute_node=slurm["allowed"])  # fmt: skip
    text = json.dumps(record, indent=1) + "\n"
    Path(answers_path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(answers_path) as tmp:
        Path(tmp).write_text(text)
    failed = [c for c in checks if not c["ok"]]
    if failed:
        raise ProbeFailed(
            f"site probe of {cluster.name} with {image} (job {record['job_id']} on "
            f"{record['host']}): {len(failed)} check(s) failed: "
            + "; ".join(f"{c['check']}: {c['detail']}" for c in failed)
            + f". All answers: {answers_path}. Fix the site or the facts, then run again "
            "(the GPU jobs wait for the probe)"
        )
    with atomic_path(record_path) as tmp:
        Path(tmp).write_text(text)
    return record


@dataclasses.dataclass(frozen=True)
class QosLimits:
    """A QOS's per-job limits as the accounting database gives them (None: no limit)."""

    nodes: int | None
    minutes: int | None
    source: str  # the command that said so


def _wall_minutes(text: str) -> int | None:
    """Slurm's MaxWall (``[days-]hours:minutes:seconds``, ``minutes``; empty: no limit)."""
    text = text.strip()
    if not text:
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    hours, minutes, seconds = ([0, 0, 0] + parts)[-3:] if len(parts) > 1 else (0, parts[0], 0)
    return int(days or 0) * 1440 + hours * 60 + minutes + (1 if seconds else 0)


def ask_qos_limits(name: str, timeout: float = 30) -> tuple[QosLimits | None, str]:
    """QOS ``name``'s per-job node and time limits from ``sacctmgr`` (on the login node,
    at plan time), or None and why it could not answer."""
    argv = ["sacctmgr", "-nP", "show", "qos", name, "format=Name,MaxTRESPerJob,MaxWall"]
    said = " ".join(argv)
    try:
        proc = _run(argv, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"`{said}` could not be run ({e})"
    if proc.returncode != 0:
        return None, f"`{said}` failed ({proc.returncode}: {_tail(proc.stderr, 1)})"
    for line in proc.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) >= 3 and fields[0] == name:
            nodes = re.search(r"(?:^|,)node=(\d+)", fields[1])
            try:
                minutes = _wall_minutes(fields[2])
            except ValueError:
                return None, f"`{said}` printed a MaxWall this cannot read: {fields[2]!r}"
            return QosLimits(int(nodes.group(1)) if nodes else None, minutes, said), ""
    return None, f"`{said}` lists no QOS {name}"


def devel_qos_unknown(cluster) -> bool:
    """Whether the site's development QOS has a limit its cluster file does not know."""
    qos = getattr(cluster, "devel_qos", None)
    return qos is not None and None in (qos.nodes, qos.max_minutes)


def with_asked_limits(cluster, asked: QosLimits | None):
    """``cluster`` with the development QOS's unknown limits as ``asked`` gives them (the
    pre-flight then sends a job over them to the profile's QOS, where it is not left
    PENDING behind the limit); itself where nothing was asked."""
    if asked is None or not devel_qos_unknown(cluster):
        return cluster
    qos = cluster.devel_qos
    filled = dataclasses.replace(
        qos,
        nodes=qos.nodes if qos.nodes is not None else asked.nodes,
        max_minutes=qos.max_minutes if qos.max_minutes is not None else asked.minutes,
    )
    return dataclasses.replace(cluster, devel_qos=filled)


def devel_qos_note(
    cluster, jobs: Mapping[str, tuple[int, int]], asked: tuple[QosLimits | None, str] = (None, "")
) -> str | None:
    """A line for the plan where the site's development QOS has limits its cluster file
    does not know (``devel_qos.nodes`` or ``max_minutes`` null): a QOS that caps below a
    job leaves it PENDING rather than refusing it, and the Slurm plugin's wait for a
    pre-flight job does not look at why. ``jobs``: what -> (nodes, minutes); ``asked``:
    what sacctmgr said of the limits (ask_qos_limits). None where there is nothing to say."""
    if not devel_qos_unknown(cluster):
        return None
    qos = cluster.devel_qos
    limits, failed = asked
    planned = with_asked_limits(cluster, limits)

    def listed(names: list[str]) -> str:
        return ", ".join(
            f"{what} ({jobs[what][0]} node{'s' if jobs[what][0] > 1 else ''}, {jobs[what][1]} min)"
            for what in names
        )

    inside = [w for w, (n, m) in jobs.items() if planned.devel_qos_for(n, m) == qos.name]
    unknown = " and ".join(
        f"devel_qos.{key}"
        for key, value in (("nodes", qos.nodes), ("max_minutes", qos.max_minutes))
        if value is None
    )
    if limits is not None:
        outside = [w for w in jobs if w not in inside]
        nodes = f"{limits.nodes} node(s)" if limits.nodes is not None else "any number of nodes"
        time = f"{limits.minutes} min" if limits.minutes is not None else "no time limit"
        return (
            f"pre-flight: the development QOS {qos.name}'s limits are not in {cluster.path} "
            f"({unknown}: null); `{limits.source}` says {nodes} and {time} per job: "
            f"{listed(inside) or 'no job'} in it, {listed(outside) or 'no job'} in the "
            f"profile's QOS. Set them in {cluster.path} (with that command as the source) "
            "to plan without asking"
        )
    if not inside:
        return None
    return (
        f"pre-flight: {listed(inside)} run in the development QOS {qos.name}, whose limits "
        f"{cluster.path} does not know ({unknown}: null), and {failed or 'sacctmgr was not asked'}. "
        "Where a job exceeds them Slurm keeps it PENDING (squeue's reason "
        "QOSMaxNodePerJobLimit or QOSMaxWallDurationPerJobLimit) and the run waits for it: "
        f"`squeue --me` shows the reason; then scancel it and set the limits in {cluster.path} "
        f"from `sacctmgr show qos {qos.name} format=Name,MaxTRESPerJob,MaxWall` (a job over "
        "them then keeps the profile's QOS)"
    )


def signal_lead_warning(record_path: str | os.PathLike, leads: dict[str, int]) -> str | None:
    """A warning where the probe found the image's torchrun without --shutdown-timeout and
    an experiment gives its workers more than torchrun's fixed 30 s after a SIGTERM
    (``leads``: experiment -> seconds, engine_process.shutdown_timeout). Slurm's signal
    before the time limit is not affected (SIGUSR2, which torchrun ignores:
    hpcllm.training.campaign.signal_lead); a SIGTERM to the job is (a plain scancel, a
    preemption): there torchrun kills the workers 30 s later. None where the record is
    missing or older than the question."""
    longer = {name: s for name, s in leads.items() if s > 30}
    if not longer or not Path(record_path).is_file():
        return None
    try:
        record = json.loads(Path(record_path).read_text())
    except ValueError:
        return None
    inside = record.get("inside") or {}
    if inside.get("torchrun_shutdown_timeout") is not False:
        return None
    named = ", ".join(f"{name} ({s} s)" for name, s in sorted(longer.items()))
    return (
        f"the site probe found torch {inside.get('torch')} in {record.get('image')} "
        f"({record_path}, job {record.get('job_id')}): its torchrun has no "
        "--shutdown-timeout, so on a SIGTERM to the job (a plain scancel, a preemption) it "
        "kills the workers 30 s later, not after the time.signal_seconds of "
        f"{named}: a torch engine's save that takes longer is lost there (Megatron-LM stops "
        "at once on SIGTERM; a torch with the option, pytorch/pytorch PR 172596, waits). "
        "The save before the time limit is not affected (Slurm's SIGUSR2, which torchrun "
        "ignores)"
    )
