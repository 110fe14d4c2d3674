"""A chain's jobs as Slurm lists them: the name they carry and one ``squeue`` of this
user's jobs. Below the chain (hpcllm.training.campaign.chain) and the calendar, which
both ask it: a segment's job finds its chain's pending successor here."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

# Slurm states of a job that is still to run or running.
LIVE_STATES = {"PENDING", "RUNNING", "SUSPENDED", "CONFIGURING", "COMPLETING", "REQUEUED"}
LISTED = ("id", "state", "dependency", "reason", "name")


class ChainError(RuntimeError):
    """The chain cannot be submitted or asked about; the message says what to do."""


def job_name_of(workdir: str | os.PathLike, name: str) -> str:
    """The name of every job of experiment ``name``'s chain: one per checkpoint folder
    (two checkouts may train the same experiment)."""
    digest = hashlib.sha256(str(Path(workdir).resolve() / "checkpoints" / name).encode())
    return f"hpcllm-chain-{name}-{digest.hexdigest()[:8]}"


def squeue_listing(timeout: float = 60) -> list[dict[str, str]]:
    """This user's jobs (one ``squeue --me``, given ``timeout`` seconds): id, state,
    dependency, reason, name."""
    try:
        proc = subprocess.run(
            ["squeue", "--me", "-h", "-o", "%i|%T|%E|%r|%j"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ChainError(f"squeue could not be run: {e}") from e
    if proc.returncode != 0:
        raise ChainError(f"squeue failed ({proc.returncode}): {proc.stderr.strip()}")
    jobs = []
    for line in proc.stdout.splitlines():
        parts = line.split("|", 4)  # the name last: it is the only field that may hold a |
        if len(parts) == 5:
            jobs.append(dict(zip(LISTED, parts, strict=True)))
    return jobs


def live_jobs(listing: list[dict[str, str]], job_name: str) -> list[dict[str, str]]:
    """The jobs of ``listing`` named ``job_name`` still to run or running, by id."""
    jobs = [j for j in listing if j["name"] == job_name and j["state"] in LIVE_STATES]
    return sorted(jobs, key=lambda j: int(j["id"].split("_")[0]))
