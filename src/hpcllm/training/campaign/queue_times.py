"""What Slurm says about a job's times: thin readers for the campaign's calendar.

``scontrol show job -o <id>`` gives a job's SubmitTime, EligibleTime (when its dependency
was met) and StartTime; ``squeue --start`` the expected start of pending jobs (``N/A``
where the scheduler has none: e.g. a job still waiting for its dependency). Both print
local time without a zone (Slurm's default ``SLURM_TIME_FORMAT``), read here as local
time. Accounting (``sacct``) is not needed: a segment job asks about itself while it runs.
The parsers are pure and unit-tested; the readers return nothing where Slurm cannot be
asked.
"""

from __future__ import annotations

import subprocess
from datetime import datetime

TIMEOUT_S = 30


def slurm_timestamp(text: str | None) -> float | None:
    """``2026-11-29T14:00:05`` (local time) as epoch seconds; None for N/A, Unknown, None."""
    if not text:
        return None
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def parse_job_times(text: str) -> dict[str, float | None]:
    """submitted, eligible, started of ``scontrol show job -o`` output (one line)."""
    fields = dict(word.split("=", 1) for word in text.split() if "=" in word)
    return {
        "submitted": slurm_timestamp(fields.get("SubmitTime")),
        "eligible": slurm_timestamp(fields.get("EligibleTime")),
        "started": slurm_timestamp(fields.get("StartTime")),
    }


def parse_expected_starts(text: str) -> dict[str, float]:
    """``<id>|<start>`` lines of ``squeue --start -o %i|%S``: job id -> expected start, for
    the jobs the scheduler gave one."""
    starts = {}
    for line in text.splitlines():
        job, _, start = line.partition("|")
        when = slurm_timestamp(start)
        if job.strip() and when is not None:
            starts[job.strip()] = when
    return starts


def slurm_output(argv: list[str], timeout: float = TIMEOUT_S) -> str | None:
    """A Slurm command's stdout; None where it failed, could not run or took longer than
    ``timeout`` seconds."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def job_times(job_id: str | None) -> dict[str, float | None]:
    """Slurm's submit, eligible and start time of ``job_id`` (all None outside Slurm)."""
    out = slurm_output(["scontrol", "show", "job", "-o", job_id]) if job_id else None
    return parse_job_times(out or "")


def expected_starts(timeout: float = TIMEOUT_S) -> dict[str, float]:
    """This user's pending jobs that the scheduler expects to start at a known time."""
    out = slurm_output(["squeue", "--me", "--start", "-h", "-o", "%i|%S"], timeout)
    return parse_expected_starts(out or "")
