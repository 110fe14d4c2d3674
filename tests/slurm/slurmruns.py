"""Running the workflow against the test cluster, and reading what the Slurm plugin left."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from support import (  # noqa: F401  (slurmruns.make_workdir in the tests)
    hang_guard,
    make_workdir,
    with_examples,
)
from testcluster import TestCluster

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def command(workdir: Path, profile: str, *args: str, examples: bool = True) -> list[str]:
    """The Snakemake command line; ``examples``: with the laptop examples over the config."""
    args = tuple(with_examples(args)) if examples else args
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
    # As after `source .venv/bin/activate`: jobs without a container find torchrun there.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if cluster is None:
        env.pop("SLURM_CONF", None)
    return env


def run(
    workdir: Path,
    cluster: TestCluster | None,
    *args: str,
    profile: str = "testcluster",
    check: bool = True,
    timeout: float | None = None,
    examples: bool = True,
) -> subprocess.CompletedProcess:
    """Run Snakemake in ``workdir`` (on ``cluster`` unless it is None); fail with its output.

    ``timeout`` is a hang guard: by default that of the built-in workflow's run on the test
    cluster (~120 s on a quiet machine; the local reference is faster)."""
    cmd = command(workdir, profile, *args, examples=examples)
    proc = subprocess.run(
        cmd,
        cwd=workdir,
        env=environment(cluster),
        capture_output=True,
        text=True,
        timeout=timeout or hang_guard(120),
    )
    if check and proc.returncode != 0:
        extra = f"\n--- cluster\n{cluster.log_tail()}" if cluster else ""
        raise AssertionError(
            f"snakemake failed ({proc.returncode}): {' '.join(cmd)}\n"
            f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-10000:]}{extra}"
        )
    return proc


def start(
    workdir: Path,
    cluster: TestCluster,
    *args: str,
    log: Path,
    profile: str = "testcluster",
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """Start Snakemake in the background; stdout and stderr go to ``log``. ``env``: set
    over the cluster's environment."""
    out = open(log, "w")  # noqa: SIM115  (closed with the process by the caller's wait)
    return subprocess.Popen(
        command(workdir, profile, *args),
        cwd=workdir,
        env={**environment(cluster), **(env or {})},
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


def fingerprints(root: Path) -> dict[str, str]:
    """A sha256 per output file under ``root``, by relative path, of what must not vary.

    Two kinds of output vary between identical runs by design, so only their content is
    compared: an LMDB's data.mdb leaves page slack uninitialised (its records are hashed
    instead), and a ``*.report.json`` records how many seconds the step took.
    """
    found = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.name in ("lock.mdb", ".snakemake_timestamp"):
            continue
        if path.name == "data.mdb":
            digest = lmdb_digest(path.parent)
        elif path.name.endswith(".report.json"):
            report = json.loads(path.read_text())
            report.pop("seconds", None)
            digest = hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest()
        else:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        found[str(path.relative_to(root))] = digest
    return found


def lmdb_digest(path: Path) -> str:
    import lmdb

    h = hashlib.sha256()
    with lmdb.open(str(path), readonly=True, lock=False, subdir=True) as env:
        with env.begin() as txn:
            for key, value in txn.cursor():
                h.update(len(key).to_bytes(8, "little") + key + len(value).to_bytes(8, "little"))
                h.update(value)
    return h.hexdigest()


def rule_headers(output: str) -> tuple[dict[str, int], dict[str, int]]:
    """Jobs Snakemake ran, by rule: (submitted, ``rule X:``; local, ``localrule X:``)."""
    remote: dict[str, int] = {}
    local: dict[str, int] = {}
    for kind, rule in re.findall(r"^(rule|localrule) (\w+):$", output, re.M):
        counts = remote if kind == "rule" else local
        counts[rule] = counts.get(rule, 0) + 1
    return remote, local
