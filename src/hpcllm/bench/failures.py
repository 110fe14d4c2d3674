"""Why a benchmark run failed, from its log text and (where known) its Slurm state.

Causes are checked in the order below: a node that died or a time limit takes the job
down with NCCL errors on every other rank, and an out-of-memory rank does the same, so
the NCCL patterns come last.
"""

from __future__ import annotations

import re
from pathlib import Path

OK = "ok"
FAILURES = ("node_failure", "time_limit", "out_of_memory", "cancelled", "nccl_error", "error")

# Slurm job/step states (sacct/squeue) that name the cause directly.
_SLURM_STATES = {
    "NODE_FAIL": "node_failure",
    "TIMEOUT": "time_limit",
    "DEADLINE": "time_limit",
    "OUT_OF_MEMORY": "out_of_memory",
    "CANCELLED": "cancelled",
    "PREEMPTED": "cancelled",
}

_PATTERNS: list[tuple[str, re.Pattern]] = [
    ("node_failure", re.compile(r"DUE TO NODE FAILURE|Node failure on|NODE_FAIL", re.I)),
    ("time_limit", re.compile(r"DUE TO TIME LIMIT|TimeLimit|job time limit", re.I)),
    (
        "out_of_memory",
        re.compile(
            r"CUDA out of memory|HIP out of memory|OutOfMemoryError|out of memory|"
            r"oom[-_]kill|OUT_OF_MEMORY|DefaultCPUAllocator: can't allocate memory",
            re.I,
        ),
    ),
    ("cancelled", re.compile(r"CANCELLED AT|scancel", re.I)),
    (
        "nccl_error",
        re.compile(
            r"NCCL error|RCCL error|nccl(?:Internal|System|UnhandledCuda|InvalidUsage|Remote)Error|"
            r"ProcessGroupNCCL.*(?:timeout|Watchdog)|Watchdog caught collective operation timeout|"
            r"NCCL communicator was aborted",
            re.I,
        ),
    ),
    (
        "error",
        re.compile(
            r"Traceback \(most recent call last\)|Error:|error: .*exit code|exitcode: [1-9]"
        ),
    ),
]


def classify_text(text: str, slurm_state: str | None = None) -> str | None:
    """The failure class the log text or Slurm state shows, or None if neither shows one."""
    if slurm_state:
        state = slurm_state.split()[0].upper()  # "CANCELLED by 1234" -> CANCELLED
        if state in _SLURM_STATES:
            return _SLURM_STATES[state]
    for name, pattern in _PATTERNS:
        if pattern.search(text):
            return name
    return None


def classify_log(paths: list[str | Path], slurm_state: str | None = None) -> str | None:
    """Classify from several logs (the run's own log, Slurm's job log); missing ones skipped."""
    text = "\n".join(
        Path(p).read_text(encoding="utf-8", errors="replace") for p in paths if Path(p).is_file()
    )
    return classify_text(text, slurm_state)
