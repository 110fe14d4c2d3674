"""Container images: which one a step uses, and building it with Apptainer/Singularity.

An image is built from ``envs/<image>.def`` into ``containers/<image>.sif`` next to a
digest file (sha256 of the image and of its definition, the runtime's version), so a
run's results can name the exact software they came from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcllm.atomic import atomic_paths
from hpcllm.clusters import Cluster

log = logging.getLogger(__name__)


class ContainerRuntimeError(RuntimeError):
    """The container runtime a cluster needs is not available here."""


def image_for(cluster: Cluster, purpose: str, use: Mapping[str, Mapping[str, str]]) -> str | None:
    """The image name for ``purpose`` ("train", "vision") on ``cluster``; None without one."""
    if not cluster.uses_containers:
        return None
    if purpose not in use:
        raise KeyError(f"containers.use has no entry '{purpose}' (has: {', '.join(use)})")
    vendor = cluster.gpu.vendor if cluster.gpu else "nvidia"
    try:
        return use[purpose][vendor]
    except KeyError:
        raise KeyError(
            f"containers.use.{purpose} names no image for {vendor} GPUs, which "
            f"{cluster.name} has ({cluster.path}): add `{vendor}: <image>` to it"
        ) from None


def runtime_executable(cluster: Cluster, which=shutil.which) -> str:
    """The path of the cluster's container runtime; a clear error when it is missing."""
    if not cluster.uses_containers:
        raise ContainerRuntimeError(
            f"{cluster.path}: container_runtime is 'none', no image is built or used"
        )
    path = which(cluster.container_runtime)
    if path is None:
        hint = f" (after `module load {' '.join(cluster.modules)}`)" if cluster.modules else ""
        raise ContainerRuntimeError(
            f"'{cluster.container_runtime}' is not on the PATH of this machine, but "
            f"{cluster.path} sets container_runtime: {cluster.container_runtime}. Run on a "
            f"node of {cluster.description} that has it{hint}, or set container_runtime: "
            "none there to run the steps in a bare-metal virtual environment."
        )
    return path


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def build_command(
    executable: str | os.PathLike,
    definition: Path,
    sif: Path,
    *,
    fakeroot: bool,
    extra: Sequence[str] = (),
) -> list[str]:
    return [
        str(executable),
        "build",
        *(["--fakeroot"] if fakeroot else []),
        "--force",  # the temporary image of an earlier, killed build may exist
        *extra,
        str(sif),
        str(definition),
    ]


def build_env(scratch: str | None, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Where Apptainer/Singularity keep layers and unpack the ~20 GB build: the project's
    scratch, not $HOME (quota) or /tmp (small, in memory on some login nodes). A value the
    user has set is kept."""
    env = dict(environ)
    base = re.sub(r"\$\{?(\w+)\}?", lambda m: environ.get(m[1], m[0]), scratch or "")
    if not base or "$" in base:
        return env
    for prefix in ("APPTAINER", "SINGULARITY"):
        env.setdefault(f"{prefix}_CACHEDIR", f"{base}/hpcllm-cache/apptainer")
        env.setdefault(f"{prefix}_TMPDIR", f"{base}/hpcllm-cache/apptainer-tmp")
    Path(env["APPTAINER_TMPDIR"]).mkdir(parents=True, exist_ok=True)
    return env


def check_build_arch(cpu_arch: str | None, machine: str | None = None) -> None:
    """A runtime builds for the machine it runs on (the NGC base is multi-architecture):
    an image for the GH200 nodes (aarch64) must be built on an aarch64 node."""
    machine = machine or platform.machine()
    if cpu_arch and machine != cpu_arch:
        raise RuntimeError(
            f"this machine is {machine}, but the cluster's GPU nodes are {cpu_arch} "
            "(config/clusters: cpu_arch): the image would not run there. Build it on a "
            f"{cpu_arch} login or compute node of the cluster."
        )


def build_image(
    executable: str | os.PathLike,
    definition: str | os.PathLike,
    sif: str | os.PathLike,
    digest: str | os.PathLike,
    *,
    fakeroot: bool,
    extra_args: Sequence[str] = (),
    cpu_arch: str | None = None,
    scratch: str | None = None,
) -> dict[str, Any]:
    """Build ``sif`` from ``definition`` and write ``digest`` (JSON); return the digest.

    The build runs in the definition's directory, so ``%files`` in it name files beside
    it. Both outputs appear only when the build succeeded. ``cpu_arch``: the architecture
    the image must have (refused on a machine of another); ``scratch``: where the
    runtime's cache and temporary folders go.
    """
    check_build_arch(cpu_arch)
    definition = Path(definition).resolve()
    sif = Path(sif).resolve()
    version = subprocess.run(
        [str(executable), "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    with atomic_paths(sif, digest) as (tmp_sif, tmp_digest):
        cmd = build_command(executable, definition, tmp_sif, fakeroot=fakeroot, extra=extra_args)
        log.info("building %s: %s", sif.name, " ".join(cmd))
        proc = subprocess.run(
            cmd, cwd=definition.parent, capture_output=True, text=True, env=build_env(scratch)
        )
        for line in (proc.stdout + proc.stderr).splitlines():
            log.info("%s", line)
        if proc.returncode != 0:
            raise RuntimeError(
                f"building {sif.name} from {definition} failed (exit {proc.returncode}); "
                "the build output is in this log above"
            )
        record = {
            "image": sif.name,
            "sha256": sha256_file(tmp_sif),
            "definition": str(definition),
            "definition_sha256": sha256_file(definition),
            "runtime": version,
            "arch": platform.machine(),
            "command": cmd,
        }
        tmp_digest.write_text(json.dumps(record, indent=2) + "\n")
    log.info("built %s, sha256 %s", sif, record["sha256"])
    return record
