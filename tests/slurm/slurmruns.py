"""Running the workflow against the test cluster, and reading what the Slurm plugin left."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

from testcluster import TestCluster

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def make_workdir(path: Path) -> Path:
    """A working directory that sees the repository's config/, resources/ and profiles/."""
    path.mkdir(parents=True, exist_ok=True)
    for name in ("config", "resources", "profiles"):
        if not (path / name).exists():
            (path / name).symlink_to(REPO / name)
    return path


def command(workdir: Path, profile: str, *args: str) -> list[str]:
    return [
        SNAKEMAKE,
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
        "--profile",
        f"profiles/{profile}",
        *args,
    ]


def environment(cluster: TestCluster | None) -> dict[str, str]:
    env = dict(cluster.env if cluster else os.environ)
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    if cluster is None:
        env.pop("SLURM_CONF", None)
    return env


def run(
    workdir: Path,
    cluster: TestCluster | None,
    *args: str,
    profile: str = "testcluster",
    check: bool = True,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """Run Snakemake in ``workdir`` (on ``cluster`` unless it is None); fail with its output."""
    cmd = command(workdir, profile, *args)
    proc = subprocess.run(
        cmd,
        cwd=workdir,
        env=environment(cluster),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        extra = f"\n--- cluster\n{cluster.log_tail()}" if cluster else ""
        raise AssertionError(
            f"snakemake failed ({proc.returncode}): {' '.join(cmd)}\n"
            f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-10000:]}{extra}"
        )
    return proc


def start(
    workdir: Path, cluster: TestCluster, *args: str, log: Path, profile: str = "testcluster"
) -> subprocess.Popen:
    """Start Snakemake in the background; stdout and stderr go to ``log``."""
    out = open(log, "w")  # noqa: SIM115  (closed with the process by the caller's wait)
    return subprocess.Popen(
        command(workdir, profile, *args),
        cwd=workdir,
        env=environment(cluster),
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
    )


def slurm_logs(workdir: Path) -> dict[str, list[tuple[str, Path]]]:
    """The plugin's logs, ``.snakemake/slurm_logs/rule_<rule>/.../<jobid>.log``, by rule."""
    found: dict[str, list[tuple[str, Path]]] = {}
    root = workdir / ".snakemake" / "slurm_logs"
    for log in sorted(root.rglob("*.log")):
        rule = log.relative_to(root).parts[0].removeprefix("rule_")
        found.setdefault(rule, []).append((log.stem, log))
    return found


def checksums(root: Path, pattern: str = "**/*") -> dict[str, str]:
    """sha256 of every file under ``root`` matching ``pattern``, by relative path."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.glob(pattern))
        if p.is_file()
    }


def jobs_run(output: str) -> dict[str, int]:
    """The job counts table Snakemake prints before a run: rule -> number of jobs."""
    counts: dict[str, int] = {}
    m = re.search(r"Job stats:\n(.*?)\n\n", output, re.S)
    if not m:
        return counts
    for line in m.group(1).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and parts[0] != "total":
            counts[parts[0]] = int(parts[1])
    return counts
