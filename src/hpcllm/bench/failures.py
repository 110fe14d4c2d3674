"""Why a run failed (a benchmark point or a training segment), from its log and Slurm state.

One classifier for both: benchmarks record the class in their summary, training segments
decide from it whether Snakemake's next attempt may continue (``TRANSIENT``) or must stop.
Causes are checked in the order below: a node that died or a time limit takes the job
down with NCCL errors on every other rank, and an out-of-memory rank does the same, so
the NCCL patterns come last.
"""

from __future__ import annotations

import re
from pathlib import Path

OK = "ok"
FAILURES = (
    "node_failure",
    "time_limit",
    "signal",
    "preempted",
    "out_of_memory",
    "cancelled",
    "nccl_error",
    "missing_file",
    "config_error",
    "error",
)
# Classes another attempt can get past: the job ran out of time, lost a node, was
# preempted or signalled, or the network failed. Out of memory, a missing file or a
# configuration the engine refuses fail the same way every time; a job a user cancelled
# stays cancelled.
TRANSIENT = frozenset({"node_failure", "time_limit", "signal", "preempted", "nccl_error"})

# Slurm job/step states (sacct/squeue) that name the cause directly.
_SLURM_STATES = {
    "NODE_FAIL": "node_failure",
    "TIMEOUT": "time_limit",
    "DEADLINE": "time_limit",
    "OUT_OF_MEMORY": "out_of_memory",
    "CANCELLED": "cancelled",
    "PREEMPTED": "preempted",
    "BOOT_FAIL": "node_failure",
}

_PATTERNS: list[tuple[str, re.Pattern]] = [
    ("node_failure", re.compile(r"DUE TO NODE FAILURE|Node failure on|NODE_FAIL", re.I)),
    (
        "time_limit",
        re.compile(
            r"DUE TO TIME LIMIT|TimeLimit|job time limit|"
            # the engines stopping by themselves before the limit (--exit-duration-in-mins):
            # the torch engine's line, Megatron-LM's
            r"^exiting at iteration \d+ \(time\)|exiting program after [\d.]+ minutes",
            re.I | re.M,
        ),
    ),
    (
        "signal",
        re.compile(
            # torch engine; Megatron-LM (--exit-signal-handler); the segment before the engine
            r"^exiting at iteration \d+ \(signal\)|exiting program at iteration \d+|"
            # torchrun (the elastic agent) signalled before its workers could act on it
            r"Received (?:\d+|Signals\.SIG\w+) death signal|SignalException",
            re.M,
        ),
    ),
    (
        "out_of_memory",
        re.compile(
            r"CUDA out of memory|HIP out of memory|OutOfMemoryError|out of memory|"
            r"oom[-_]kill|OUT_OF_MEMORY|DefaultCPUAllocator: can't allocate memory",
            re.I,
        ),
    ),
    ("cancelled", re.compile(r"CANCELLED AT|scancel|PREEMPTION", re.I)),
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
        "missing_file",
        re.compile(r"FileNotFoundError|No such file or directory|DataError: .*missing", re.I),
    ),
    (
        "config_error",
        re.compile(
            # Megatron-LM's argument checks (asserts in validate_args), our own refusals
            r"AssertionError|argparse|error: unrecognized arguments|error: argument|"
            r"ValueError: |CheckpointError: |DataError: ",
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


def is_transient(failure: str | None) -> bool:
    """Whether another attempt may get past ``failure`` (None, unknown: no)."""
    return failure in TRANSIENT
