"""Container images: which one a step uses, and building it the site's way.

Per site (``container_build.method`` in config/clusters/<name>.yaml):
- ``definition``: Apptainer/Singularity builds ``envs/<image>.def``;
- ``cotainr``: cotainr builds a conda environment, ``envs/<image>.cotainr.yml`` with the
  packages of ``envs/requirements.txt`` added to its pip list, on the site's base image
  (LUMI: no fakeroot, no user namespaces, so no ``%post`` with apt-get);
- ``copy``: nothing is built there; the image is built elsewhere and copied to
  ``containers/<image>.sif`` (:func:`image_plan_error` says so at plan time).
A build writes ``containers/<image>.sif`` next to a digest file (sha256 of the image and of
its recipe, the tool's version), so a run's results can name the exact software they came
from.
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

import yaml

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


def build_executable(cluster: Cluster, which=shutil.which) -> str:
    """The path of the tool that builds the cluster's images (its runtime, or cotainr)."""
    if cluster.container_build.method != "cotainr":
        return runtime_executable(cluster, which)
    path = which("cotainr")
    if path is None:
        raise ContainerRuntimeError(
            f"'cotainr' is not on the PATH of this machine, but {cluster.path} builds images "
            "with it (container_build.method: cotainr). Load it as the site documents "
            "(LUMI: `module load CrayEnv cotainr`) and plan again."
        )
    return path


def cotainr_recipe(definition: str | os.PathLike) -> Path:
    """The conda environment template of an image: ``envs/<image>.cotainr.yml`` beside
    its ``envs/<image>.def``."""
    definition = Path(definition)
    return definition.with_name(definition.stem + ".cotainr.yml")


def recipe_path(cluster: Cluster, definition: str | os.PathLike) -> Path:
    """What the cluster's build method reads: the definition, or its cotainr template."""
    if cluster.container_build.method == "cotainr":
        return cotainr_recipe(definition)
    return Path(definition)


_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def requirement_lines(path: str | os.PathLike) -> list[str]:
    """The requirement lines of a pip requirements file (comments and blanks left out)."""
    lines = []
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            lines.append(line)
    return lines


def cotainr_env(template: Mapping[str, Any], requirements: Sequence[str]) -> dict[str, Any]:
    """The conda environment cotainr installs: ``template`` (python, the site's GPU build of
    PyTorch, Megatron-LM at the pin) with ``requirements`` appended to its pip list; a
    package the template already names keeps the template's line."""
    env = json.loads(json.dumps(dict(template)))  # a deep copy of plain YAML data
    deps = env.setdefault("dependencies", [])
    pip = next((d["pip"] for d in deps if isinstance(d, dict) and "pip" in d), None)
    if pip is None:
        pip = []
        deps.append({"pip": pip})
    if not any(isinstance(d, str) and re.match(r"pip\b", d) for d in deps):
        deps.insert(0, "pip")

    def name(line: str) -> str | None:
        m = _REQUIREMENT_NAME.match(line)
        return m[1].lower().replace("_", "-") if m and not line.startswith("-") else None

    named = {name(line) for line in pip} - {None}
    pip += [line for line in requirements if name(line) not in named]
    return env


def missing_index(env: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> str | None:
    """A message when the environment asks for local-version wheels (``torch==2.6.0+rocm6.2.4``)
    but pip is given no extra index to find them in."""
    pip = next((d["pip"] for d in env.get("dependencies", []) if isinstance(d, dict)), [])
    local = [line for line in pip if re.search(r"==[^ ;]*\+", line)]
    if not local or environ.get("PIP_EXTRA_INDEX_URL") or any("index-url" in x for x in pip):
        return None
    return (
        f"{', '.join(local)} are builds that only their project's own wheel index serves "
        "(PyTorch's for the ROCm version, pytorch.org 'Get started'): export "
        "PIP_EXTRA_INDEX_URL=<that index> and build again"
    )


_MEGATRON_PIP = re.compile(r"git\+(https://\S+/Megatron-LM\.git)@([0-9a-f]{40})")


def megatron_pin(env: Mapping[str, Any]) -> tuple[str, str] | None:
    """(repository, commit) of the Megatron-LM a conda environment installs from git."""
    for dep in env.get("dependencies", []):
        for line in dep.get("pip", []) if isinstance(dep, dict) else []:
            found = _MEGATRON_PIP.search(line)
            if found:
                return found[1], found[2]
    return None


def megatron_checkout_dir(scratch: str, commit: str) -> str:
    """Where a cotainr image's Megatron-LM scripts live on the host, bound into the
    container at /opt/Megatron-LM (config/clusters/lumi.yaml: container_binds)."""
    return f"{scratch.rstrip('/')}/hpcllm-cache/Megatron-LM-{commit}"


def checkout_megatron(dest: str | os.PathLike, repo: str, commit: str) -> Path:
    """A checkout of ``repo`` at ``commit`` in ``dest`` (kept when it is there already):
    Megatron-LM's pip package lacks the scripts at the repository's top (pretrain_gpt.py,
    gpt_builders.py, model_provider.py) that the jobs run from /opt/Megatron-LM."""
    dest = Path(dest)
    if (dest / "pretrain_gpt.py").is_file():
        return dest
    with atomic_paths(dest) as (tmp,):
        for cmd in (
            ["git", "clone", "--quiet", "--filter=blob:none", "--no-checkout", repo, str(tmp)],
            ["git", "-C", str(tmp), "checkout", "--quiet", "--detach", commit],
        ):
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
        head = subprocess.run(
            ["git", "-C", str(tmp), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        if head != commit or not (tmp / "pretrain_gpt.py").is_file():
            raise RuntimeError(f"{repo} at {commit}: got {head or 'nothing'}, no pretrain_gpt.py")
    return dest


# Where the jobs find Megatron-LM's tree in every image (a cotainr image: bound there).
MEGATRON_IN_IMAGE = "/opt/Megatron-LM"
# Megatron's dataset helpers (C++, pybind11). Rank 0 of every job runs ``make`` in this
# folder at start-up (initialize_megatron's _compile_dependencies) and exits when it fails
# (no pybind11, a read-only tree): built with the image, that make has nothing to do. The
# import is the check that the module is the image's Python's.
HELPERS_DIR = "megatron/core/datasets"
HELPERS_IMPORT = "from megatron.core.datasets import helpers_cpp; print(helpers_cpp.__file__)"


def megatron_helpers_commands(runtime: str | os.PathLike, sif: Path, checkout: Path) -> list:
    """Build Megatron's dataset helpers in a cotainr image's bound checkout with the
    image's own compiler and Python, then import them as a job would."""
    run = [str(runtime), "exec", "--bind", f"{checkout}:{MEGATRON_IN_IMAGE}", str(sif)]
    return [
        [*run, "make", "-C", f"{MEGATRON_IN_IMAGE}/{HELPERS_DIR}"],
        [*run, "python", "-c", f"import sys; sys.path.insert(0, {MEGATRON_IN_IMAGE!r}); "
         + HELPERS_IMPORT],
    ]  # fmt: skip


def cotainr_command(
    executable: str | os.PathLike, sif: Path, base_image: str, conda_env: Path
) -> list[str]:
    return [
        str(executable),
        "build",
        str(sif),
        f"--base-image={base_image}",
        f"--conda-env={conda_env}",
        "--accept-licenses",  # Miniforge's licence: the build runs without a terminal
    ]


def image_plan_error(
    cluster: Cluster, image: str, sif: str | os.PathLike, definition: str | os.PathLike
) -> str | None:
    """Why ``sif`` can be neither found nor built for ``cluster`` (None when it can).

    An image in place is taken as it is where the site builds nothing (``copy``). Else the
    build needs the internet (the base image, packages) where it runs: the login node, or
    a compute node where the site builds there.
    """
    build = cluster.container_build
    where = f"{cluster.path}: container_build"
    stage = (
        f"Build it on a machine with internet and root or fakeroot (`apptainer build "
        f"--fakeroot {image}.sif {image}.def` in envs/, for the GPU nodes' {cluster.cpu_arch}) "
        f"and copy it to {os.path.abspath(sif)}"
    )
    if Path(sif).is_file():
        return None
    if build.method == "copy":
        return (
            f"containers/{image}.sif is missing: {cluster.description} builds no images "
            f"({where}.method: copy). {stage}; it is then used as it is, never rebuilt."
        )
    nodes = "compute" if build.on_compute_node else "login"
    if not getattr(cluster.internet, nodes):
        return (
            f"containers/{image}.sif is missing and cannot be built here: building it "
            f"downloads its base image and packages, but the {nodes} nodes of "
            f"{cluster.description} have no internet ({cluster.path}: internet.{nodes}). "
            f"{stage}, and set {where}.method: copy."
        )
    if build.method == "cotainr" and not cotainr_recipe(definition).is_file():
        return (
            f"{cotainr_recipe(definition)} is missing: {cluster.description} builds "
            f"{image} with cotainr ({where}.method), from that conda environment file "
            "(python, the site's PyTorch build, Megatron-LM; envs/requirements.txt is added)."
        )
    return None


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


def _expand(text: str, environ: Mapping[str, str]) -> str:
    """``$NAME``/``${NAME}`` from ``environ``; unknown ones stay as written."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: environ.get(m[1], m[0]), text)


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


def _run_build(cmd: list[str], cwd: Path, scratch: str | None, what: str) -> None:
    """Run a build command, its output into the log; a failure names what was built."""
    log.info("%s: %s", what, " ".join(cmd))
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=build_env(scratch))
    for line in (proc.stdout + proc.stderr).splitlines():
        log.info("%s", line)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{what} failed (exit {proc.returncode}); the build output is in this log above"
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
        _run_build(cmd, definition.parent, scratch, f"building {sif.name} from {definition}")
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


def build_image_cotainr(
    executable: str | os.PathLike,
    template: str | os.PathLike,
    sif: str | os.PathLike,
    digest: str | os.PathLike,
    *,
    base_image: str,
    requirements: str | os.PathLike | None = None,
    cpu_arch: str | None = None,
    scratch: str | None = None,
    environ: Mapping[str, str] = os.environ,
    megatron_root: str | os.PathLike | None = None,
    runtime: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Build ``sif`` with cotainr from the conda environment ``template`` plus the lines of
    ``requirements`` (default: ``requirements.txt`` beside the template) on
    ``base_image``; write ``digest`` (JSON, the environment included); return the digest.

    Both outputs appear only when the build succeeded; the environment file cotainr read
    stays beside the image (``<image>.conda-env.yml``) for the record. Where the
    environment installs Megatron-LM from git, a checkout at that commit is made under
    ``megatron_root`` (default: ``scratch``; :func:`megatron_checkout_dir`) for the scripts
    the package lacks, and its dataset helpers are built there inside the new image with
    ``runtime`` (default: singularity or apptainer on the PATH; see
    :func:`megatron_helpers_commands`).
    """
    check_build_arch(cpu_arch)
    template = Path(template).resolve()
    sif = Path(sif).resolve()
    requirements = Path(requirements or template.with_name("requirements.txt"))
    env = cotainr_env(yaml.safe_load(template.read_text()) or {}, requirement_lines(requirements))
    index_error = missing_index(env, environ)
    if index_error:
        raise RuntimeError(f"{template}: {index_error}")
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    if environ.get("PIP_EXTRA_INDEX_URL") and not any("index-url" in x for x in pip):
        # in the file, not only in the environment: cotainr's build may not pass it on,
        # and the record then says where the wheels came from
        pip.insert(0, f"--extra-index-url {environ['PIP_EXTRA_INDEX_URL']}")
    env_text = yaml.safe_dump(env, sort_keys=False)
    env_file = sif.with_name(sif.name.removesuffix(".sif") + ".conda-env.yml")
    version = subprocess.run(
        [str(executable), "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    with atomic_paths(sif, env_file, digest) as (tmp_sif, tmp_env, tmp_digest):
        tmp_env.write_text(env_text)
        cmd = cotainr_command(executable, tmp_sif, base_image, tmp_env)
        _run_build(
            cmd, template.parent, scratch, f"building {sif.name} with cotainr from {template}"
        )
        record = {
            "image": sif.name,
            "sha256": sha256_file(tmp_sif),
            "method": "cotainr",
            "base_image": base_image,
            "recipe": str(template),
            "recipe_sha256": sha256_file(template),
            "requirements_sha256": sha256_file(requirements),
            "conda_env": env,
            "runtime": version,
            "arch": platform.machine(),
            "command": cotainr_command(executable, sif, base_image, env_file),
        }
        pin = megatron_pin(env)
        root = megatron_root or _expand(scratch or "", environ)
        if pin and root and "$" not in str(root):
            checkout = checkout_megatron(megatron_checkout_dir(str(root), pin[1]), *pin)
            record["megatron_checkout"] = str(checkout)
            runtime = runtime or shutil.which("singularity") or shutil.which("apptainer")
            if runtime is None:
                raise RuntimeError(
                    "neither singularity nor apptainer is on the PATH: the build runs the "
                    "new image to compile Megatron-LM's dataset helpers in "
                    f"{checkout}. Load the site's container runtime and build again."
                )
            for cmd in megatron_helpers_commands(runtime, tmp_sif, checkout):
                _run_build(
                    cmd, template.parent, scratch, f"Megatron-LM's dataset helpers in {checkout}"
                )
            record["megatron_helpers"] = sorted(
                str(p) for p in (checkout / HELPERS_DIR).glob("helpers_cpp*")
            )
        elif pin:
            log.warning(
                "no scratch folder to put the Megatron-LM checkout in (%s): bind one at "
                "the pin to /opt/Megatron-LM yourself",
                scratch,
            )
        tmp_digest.write_text(json.dumps(record, indent=2) + "\n")
    log.info("built %s, sha256 %s", sif, record["sha256"])
    return record
