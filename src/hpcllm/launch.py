"""The command line and environment of a (multi-node) PyTorch step on a cluster.

On a Slurm cluster the batch job runs ``srun`` with one task per node; each task starts
the cluster's launcher (``torchrun``, or ``torchrun_jsc`` on the Jülich systems), inside
the container where there is one, and the launchers meet at a c10d rendezvous on the
first node of the allocation. Without Slurm it is ``torchrun --standalone`` on this
machine, or the bare command for a single process.

Everything that reaches a shell is quoted: ``$NAME`` and ``${NAME}`` references are
expanded when the job runs (``$SLURM_JOB_ID``, a site's ``$SCRATCH``), nothing else is
(a value ``; rm -rf ~`` stays that string).
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hpcllm.clusters import VARIABLE as _VARIABLE
from hpcllm.clusters import Cluster

# Set by Slurm or by the script itself: never checked for being set before use.
_RUNTIME_VARIABLE = re.compile(r"^(SLURM_\w*|SRUN_\w*|MASTER_ADDR|MASTER_PORT)$")

# Job variables that the Slurm plugin's job step removes before running the rule (it keeps
# only SLURM_JOB_ID and a few others), with the field of `scontrol show job` that holds
# them: a launch whose environment needs one reads it back from the job.
_FROM_JOB_RECORD = {"SLURM_CPUS_PER_TASK": "CPUs/Task"}

# The rendezvous port of a job, from its id: a fixed port (torchrun's 29500) is taken by
# the first of two jobs that share a node (a shared partition, or two test clusters on one
# host), and the second one's launchers then fail to bind or meet the other job's store.
# 15000-29999 stays below Linux's ephemeral range (32768-60999, ip_local_port_range), so
# no outgoing connection holds it.
JOB_PORT_BASE, JOB_PORT_SPAN = 15000, 15000
JOB_PORT_SHELL = f"$(( {JOB_PORT_BASE} + SLURM_JOB_ID % {JOB_PORT_SPAN} ))"

RUNTIME_EXEC = {"apptainer": "apptainer", "singularity": "singularity"}
GPU_FLAG = {"nvidia": "--nv", "amd": "--rocm"}


def shell_word(text: str) -> str:
    """``text`` as one shell word: variable references expand, nothing else does."""
    parts: list[str] = []
    pos = 0
    for match in _VARIABLE.finditer(text):
        if match.start() > pos:
            parts.append(shlex.quote(text[pos : match.start()]))
        parts.append('"${%s}"' % (match.group(1) or match.group(2)))
        pos = match.end()
    if pos < len(text) or not parts:
        parts.append(shlex.quote(text[pos:]))
    return "".join(parts)


def referenced_variables(text: str) -> list[str]:
    return [m.group(1) or m.group(2) for m in _VARIABLE.finditer(text)]


@dataclass(frozen=True)
class Launch:
    """What a batch job runs: ``argv`` in the environment ``env``.

    ``argv`` may contain ``${MASTER_ADDR}`` and ``${SLURM_JOB_ID}``; ``shell()`` gives
    the script that sets them (the rendezvous host is the first node of the job).
    """

    argv: list[str]
    env: dict[str, str]
    rendezvous_suffix: str | None = None  # None: no rendezvous host to resolve
    modules: tuple[str, ...] = ()
    source: str = ""  # where the environment comes from, for error messages
    unset_in_container: tuple[str, ...] = field(default=())
    # Variables set at the start of the script to the newest path matching a glob.
    globs: dict[str, str] = field(default_factory=dict)

    def shell(self) -> str:
        lines = ["#!/bin/bash", "set -eo pipefail"]
        if self.modules:
            lines.append("module purge")
            lines += [f"module load {shlex.quote(m)}" for m in self.modules]
        lines.append("set -u")
        needed = sorted(
            {
                var
                for value in self.env.values()
                for var in referenced_variables(value)
                if not _RUNTIME_VARIABLE.match(var)
                and var not in self.env
                and var not in self.globs
            }
        )
        for var in needed:
            message = shlex.quote(f"{var} is not set; the job environment ({self.source}) needs it")
            lines.append(f'if [ -z "${{{var}-}}" ]; then echo {message} >&2; exit 1; fi')
        for var, pattern in self.globs.items():
            # The newest version folder (sort -V); the pattern unquoted, so that it expands
            # (clusters.py allows only path characters and wildcards in it).
            message = shlex.quote(f"no path matches {pattern} ({self.source}: env_globs.{var})")
            lines += [
                f'{var}="$(ls -d {pattern} 2>/dev/null | sort -V | tail -n 1 || true)"',
                f'if [ -z "${var}" ]; then echo {message} >&2; exit 1; fi',
                f"export {var}",
            ]
        if self.rendezvous_suffix is not None:  # a Slurm job
            lines += _restore_job_variables(self.env.values())
        for name, value in self.env.items():
            export = f"export {name}={shell_word(value)}"
            runtime = [v for v in referenced_variables(value) if _RUNTIME_VARIABLE.match(v)]
            if runtime:  # e.g. SLURM_CPUS_PER_TASK exists only when the job asked for it
                test = " && ".join(f'[ -n "${{{v}-}}" ]' for v in runtime)
                export = f"if {test}; then {export}; fi"
            lines.append(export)
        if self.rendezvous_suffix is not None:
            # The first node of the job. sed reads the whole list: `head -n1` would close
            # the pipe early and, with pipefail, kill the script on scontrol's SIGPIPE.
            # The Slurm plugin's job step removes SLURM_* variables but SLURM_JOB_ID, so
            # the node list may have to come from squeue.
            lines.append('NODELIST="${SLURM_JOB_NODELIST:-$(squeue -h -j "$SLURM_JOB_ID" -o %N)}"')
            lines.append('MASTER_ADDR="$(scontrol show hostnames "$NODELIST" | sed -n 1p)"')
            lines.append(
                'if [ -z "$MASTER_ADDR" ]; then echo "no node list for job $SLURM_JOB_ID" >&2; '
                "exit 1; fi"
            )
            if self.rendezvous_suffix:
                lines.append(f'MASTER_ADDR="$MASTER_ADDR"{shell_word(self.rendezvous_suffix)}')
            lines.append("export MASTER_ADDR")
            if "MASTER_PORT" not in self.env:
                lines += [f"MASTER_PORT={JOB_PORT_SHELL}", "export MASTER_PORT"]
        lines.append("exec " + " ".join(shell_word(a) for a in self.argv))
        return "\n".join(lines) + "\n"


def _restore_job_variables(values) -> list[str]:
    """Script lines that read hidden job variables the environment needs back from the
    job's record (SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK: without it each task of the
    job's srun gets one core)."""
    needed = sorted(
        {v for value in values for v in referenced_variables(value) if v in _FROM_JOB_RECORD}
    )
    lines = []
    for var in needed:
        field = _FROM_JOB_RECORD[var]
        lines += [
            f'if [ -z "${{{var}-}}" ] && [ -n "${{SLURM_JOB_ID-}}" ]; then',
            f'  {var}="$(scontrol show job -o "$SLURM_JOB_ID" '
            f"| sed -n 's|.* {field}=\\([0-9][0-9]*\\).*|\\1|p' || true)\"",
            f'  if [ -n "${var}" ]; then export {var}; else unset {var}; fi',
            "fi",
        ]
    return lines


def container_exec(
    cluster: Cluster, container: str, binds: Sequence[str] = (), unset: Sequence[str] = ()
) -> list[str]:
    """``apptainer exec --nv ... image.sif`` (``--rocm`` on AMD), or [] without a runtime."""
    if not cluster.uses_containers:
        raise ValueError(
            f"{cluster.path}: container_runtime is 'none' on {cluster.name}, so the step "
            f"cannot run in {container}; run it without a container (bare-metal venv)"
        )
    argv = [RUNTIME_EXEC[cluster.container_runtime], "exec"]
    if cluster.gpu is not None:
        argv.append(GPU_FLAG[cluster.gpu.vendor])
    all_binds = [*cluster.container_binds, *binds]
    if all_binds:
        argv += ["--bind", ",".join(all_binds)]
    argv.append(container)
    if unset:
        argv += ["env", *(a for name in unset for a in ("-u", name))]
    return argv


def bare_metal_tool(name: str) -> str:
    """``name`` from this Python's environment where it is there (the venv's torchrun, so
    that jobs need not activate the venv), else ``name`` to be found on the PATH."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def checkout_src() -> str:
    """The ``src/`` folder this process imported ``hpcllm`` from: the planned checkout's."""
    import hpcllm

    return str(Path(hpcllm.__file__).resolve().parent.parent)


def python_for(container: str | None) -> str:
    """This environment's Python outside a container; the image's ``python`` inside one."""
    return "python" if container else sys.executable


def package_in_container(container: str | None) -> tuple[list[str], dict[str, str]]:
    """Binds and environment that let ``python -m hpcllm...`` run in ``container``.

    The images have no ``hpcllm`` (envs/requirements.txt): the checkout's ``src/`` is bound
    and put on ``PYTHONPATH``. Nothing is needed outside a container.
    """
    if not container:
        return [], {}
    src = checkout_src()
    return [src], {"PYTHONPATH": src}


def build_launch(
    cluster: Cluster,
    *,
    nodes: int,
    procs_per_node: int,
    command: Sequence[str],
    container: str | None = None,
    master_port: int | None = None,
    binds: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    rendezvous: bool = False,
    launcher_ignores: str | None = None,
) -> Launch:
    """The launch of ``command`` on ``nodes`` x ``procs_per_node`` processes.

    ``command`` is the complete argv of one process, program first
    (``["python", "pretrain_gpt.py", ...]``): the launcher runs it with ``--no-python``.
    ``env`` adds to (and overrides) the cluster's job environment. The rendezvous port is
    ``master_port``, or by default one the job script derives from the job id
    (``job_port_shell``). ``rendezvous``: the command joins torch.distributed through the
    environment (Megatron's ``env://``), so even one process without Slurm gets torchrun
    (``--standalone``: MASTER_ADDR, a free port, RANK and WORLD_SIZE).
    ``launcher_ignores``: a signal name (``USR2``) the launcher is started with ignored
    (:func:`ignoring`), so that one meant for the workers does not end it.
    """
    if nodes < 1 or procs_per_node < 1:
        raise ValueError(f"nodes ({nodes}) and procs_per_node ({procs_per_node}) must be >= 1")
    if not command:
        raise ValueError("the command to launch is empty")
    if cluster.gpus_per_node and procs_per_node > cluster.gpus_per_node:
        raise ValueError(
            f"{procs_per_node} processes per node, but a {cluster.name} node has "
            f"{cluster.gpus_per_node} GPUs ({cluster.path}): use at most one process per GPU"
        )
    job_env = {**_threads_env(cluster), **cluster.env, **(env or {})}
    unset_inside: tuple[str, ...] = ()
    if container is not None:
        job_env.update(cluster.env_outside_container)
        unset_inside = tuple(cluster.env_outside_container)

    if not cluster.uses_slurm:
        if nodes > 1:
            raise ValueError(
                f"{nodes} nodes asked for on '{cluster.name}', which has no scheduler: "
                "a single machine runs one node"
            )
        inner = (
            list(command)
            if procs_per_node == 1 and not rendezvous
            else [
                *ignoring(launcher_ignores),
                bare_metal_tool("torchrun") if container is None else "torchrun",
                "--standalone",
                "--nproc_per_node",
                str(procs_per_node),
                "--no-python",
                *command,
            ]
        )
        argv = (container_exec(cluster, container, binds) if container else []) + inner
        return Launch(
            argv=argv,
            env=job_env,
            modules=cluster.modules,
            source=cluster.path or cluster.name,
            globs=cluster.env_globs,
        )

    if master_port is not None:
        job_env["MASTER_PORT"] = str(master_port)
    srun = [
        "srun",
        "--nodes",
        str(nodes),
        "--ntasks",
        str(nodes),
        "--ntasks-per-node",
        "1",
        "--kill-on-bad-exit=1",
        *cluster.srun_args,
    ]
    if cluster.gpu_cpu_masks:
        # The one task per node gets the cores of all GPUs; each rank its GPU's own below.
        union = 0
        for mask in cluster.gpu_cpu_masks:
            union |= int(mask, 16)
        srun.append(f"--cpu-bind=mask_cpu:{union:#x}")
        command = bind_rank_to_gpu_cores(cluster, command)
    inside = container_exec(cluster, container, binds, unset_inside) if container else []
    launcher = [
        *ignoring(launcher_ignores),
        bare_metal_tool(cluster.launcher) if container is None else cluster.launcher,
        "--nnodes",
        str(nodes),
        "--nproc_per_node",
        str(procs_per_node),
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "${MASTER_ADDR}:${MASTER_PORT}",
        "--rdzv_id",
        "${SLURM_JOB_ID}",
        "--no-python",
    ]
    return Launch(
        argv=srun + inside + launcher + list(command),
        env=job_env,
        rendezvous_suffix=cluster.rendezvous_suffix,
        modules=cluster.modules,
        source=cluster.path or cluster.name,
        unset_in_container=unset_inside,
        globs=cluster.env_globs,
    )


# The words before the launcher that start it with a signal ignored: bash's `trap ""` sets
# SIG_IGN, which exec keeps. torchrun (torch.distributed.elastic) installs handlers for
# SIGTERM, SIGINT, SIGHUP and SIGQUIT only, so SIGUSR2 stays ignored in it, while its
# workers, which inherit SIG_IGN too, install their own handler (Megatron-LM's
# --exit-signal, the torch engine's). Inside the container where there is one: the
# runtime (apptainer's starter forwards the signals it gets) is not the launcher.
def ignoring(signal_name: str | None) -> list[str]:
    """``bash -c 'trap "" USR2; exec "$0" "$@"'`` for ``USR2``; nothing for None."""
    if signal_name is None:
        return []
    if not re.fullmatch(r"[A-Z][A-Z0-9]*", signal_name):
        raise ValueError(f"not a signal name: {signal_name!r} (e.g. USR2)")
    return ["bash", "-c", f'trap "" {signal_name}; exec "$0" "$@"']


def _threads_env(cluster: Cluster) -> dict[str, str]:
    """OMP_NUM_THREADS per rank: the node's cores per GPU (a cluster's env may override
    it). Without it each rank inherits the job's thread count (Snakemake sets the rule's
    threads, up to a whole node's cores per rank) and the ranks oversubscribe the node."""
    if not cluster.gpus_per_node:
        return {}
    return {"OMP_NUM_THREADS": str(cluster.cores_per_gpu)}


# Run by the launcher for each rank: bind the process to the cores of its GPU (the
# LOCAL_RANK-th mask), then replace it with the rank's command. Python, not a shell, so
# that nothing in it is a $ reference for the job script to expand.
_BIND_CODE = (
    "import os,sys;m=int(sys.argv[1].split(',')[int(os.environ['LOCAL_RANK'])],16);"
    "os.sched_setaffinity(0,[c for c in range(m.bit_length()) if m>>c&1]);"
    "os.execvp(sys.argv[2],sys.argv[2:])"
)


def bind_rank_to_gpu_cores(cluster: Cluster, command: Sequence[str]) -> list[str]:
    """``command`` run with each rank bound to the CPU cores nearest its GPU.

    torchrun starts the ranks of a node inside one srun task, so srun's per-task masks
    cannot place them; LUMI's AI guide binds each rank by its local rank instead (CPU-GPU
    binding with torchrun), which this does before the rank's program starts. The same
    interpreter runs it: the image's ``python`` in a container, this one outside.
    """
    first = Path(command[0]).name
    python = command[0] if first.startswith("python") else "python3"
    return [python, "-c", _BIND_CODE, ",".join(cluster.gpu_cpu_masks), *command]


def clean_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The submitter's environment without the SLURM_*/SBATCH_* of a job it runs in (sbatch
    and srun read some of them as options); SLURM_CONF stays."""
    return {
        k: v
        for k, v in environ.items()
        if not (k.startswith(("SLURM_", "SBATCH_", "SRUN_")) and k != "SLURM_CONF")
    }
