"""One writer per checkpoint folder: a lease held by the segment job that trains into it.

``checkpoints/<experiment>/writer.lease`` names the holder (Slurm job id, host, process)
and when it last renewed it; the holder renews it every ``RENEW_SECONDS`` while it runs
and removes it when it ends. A restarted Snakemake controller does not reattach to the
jobs it had submitted (the Slurm plugin cannot), so it may submit a second job for a
segment whose first job still runs: that job finds the lease of a live job and refuses to
start, naming the job. A lease whose job Slurm no longer knows as live (it ended, was
killed, its node died) is stale and taken over.

Liveness: a Slurm holder is live while squeue lists its job as pending, running,
suspended, configuring or completing. A holder outside Slurm is live while its process
exists (same host) or, seen from another host, while it renewed within ``STALE_SECONDS``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from hpcllm.atomic import atomic_path

LEASE = "writer.lease"
RENEW_SECONDS = 60.0
STALE_SECONDS = 5 * RENEW_SECONDS
_LIVE_STATES = {"PENDING", "RUNNING", "SUSPENDED", "CONFIGURING", "COMPLETING", "REQUEUED"}


class LeaseHeld(RuntimeError):
    """Another live job writes this checkpoint folder; the message says what to do."""


@dataclass
class Holder:
    job_id: str | None
    host: str
    pid: int
    renewed: float

    def describe(self) -> str:
        who = f"Slurm job {self.job_id}" if self.job_id else f"process {self.pid}"
        return f"{who} on {self.host}"


def lease_path(save: str | os.PathLike) -> Path:
    return Path(save) / LEASE


def read(save: str | os.PathLike) -> Holder | None:
    path = lease_path(save)
    try:
        return Holder(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError):
        return None  # a torn or foreign file holds nothing: it is taken over


def _write(save: str | os.PathLike, holder: Holder) -> None:
    with atomic_path(lease_path(save)) as tmp:
        tmp.write_text(json.dumps(asdict(holder)) + "\n")


def squeue_job(job_id: str) -> subprocess.CompletedProcess | None:
    """squeue's answer for one job in any state (its state on stdout); None when squeue
    cannot be run."""
    try:
        return subprocess.run(
            ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


def slurm_job_live(job_id: str) -> bool | None:
    """Whether Slurm lists the job as live; None when squeue cannot answer."""
    proc = squeue_job(job_id)
    if proc is None:
        return None
    if proc.returncode != 0:
        # squeue refuses a job id it no longer knows ("Invalid job id specified")
        return False if "Invalid job id" in proc.stderr else None
    states = proc.stdout.split()
    return bool(states) and states[0] in _LIVE_STATES


def holder_live(holder: Holder, job_live: Callable[[str], bool | None] = slurm_job_live) -> bool:
    if holder.job_id:
        live = job_live(holder.job_id)
        if live is not None:
            return live
    elif holder.host == socket.gethostname():
        try:
            os.kill(holder.pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    return time.time() - holder.renewed < STALE_SECONDS


def me(environ=os.environ) -> Holder:
    return Holder(environ.get("SLURM_JOB_ID"), socket.gethostname(), os.getpid(), time.time())


def _is_me(holder: Holder, mine: Holder) -> bool:
    if mine.job_id:
        return holder.job_id == mine.job_id
    return holder.host == mine.host and holder.pid == mine.pid


def acquire(save: str | os.PathLike, mine: Holder, job_live=slurm_job_live) -> Holder | None:
    """Take the lease; return the stale holder taken over (None if it was free).

    Raises LeaseHeld while a live job other than this one holds it.
    """
    Path(save).mkdir(parents=True, exist_ok=True)
    # An exclusive lock file makes check-and-write atomic between jobs starting at once.
    with open(Path(save) / (LEASE + ".lock"), "w") as lock:
        import fcntl

        fcntl.flock(lock, fcntl.LOCK_EX)
        holder = read(save)
        if holder is not None and not _is_me(holder, mine) and holder_live(holder, job_live):
            raise LeaseHeld(
                f"{save} is being written by {holder.describe()} (lease renewed "
                f"{time.time() - holder.renewed:.0f} s ago): a second writer would corrupt "
                f"its checkpoints. A restarted Snakemake does not reattach to jobs it had "
                f"submitted: wait until that job ends (squeue -j {holder.job_id or '...'}), "
                f"or cancel it (scancel {holder.job_id or holder.pid}), then rerun."
            )
        _write(save, mine)
        return None if holder is None or _is_me(holder, mine) else holder


def release(save: str | os.PathLike, mine: Holder) -> None:
    holder = read(save)
    if holder is not None and _is_me(holder, mine):
        with contextlib.suppress(FileNotFoundError):
            lease_path(save).unlink()


@contextlib.contextmanager
def held(
    save: str | os.PathLike,
    job_live=slurm_job_live,
    renew_seconds: float = RENEW_SECONDS,
    on_takeover: Callable[[Holder], None] | None = None,
) -> Iterator[Holder]:
    """Hold the lease for the duration of the block, renewing it in a thread."""
    mine = me()
    stale = acquire(save, mine, job_live)
    if stale is not None and on_takeover is not None:
        on_takeover(stale)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(renew_seconds):
            mine.renewed = time.time()
            holder = read(save)
            if holder is None or _is_me(holder, mine):
                _write(save, mine)

    thread = threading.Thread(target=renew, name="lease-renewal", daemon=True)
    thread.start()
    try:
        yield mine
    finally:
        stop.set()
        thread.join()
        release(save, mine)
