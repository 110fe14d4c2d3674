"""Why a run failed (a benchmark point or a training segment), from its log and Slurm state.

One classifier for both: benchmarks record the class in their summary, training segments
decide from it whether Snakemake's next attempt may continue (``TRANSIENT``) or must stop.
Causes are checked in the order below: a node that died or a time limit takes the job
down with NCCL errors on every other rank, and an out-of-memory rank does the same, so
the NCCL patterns come after them, and the rendezvous' after the engine's own refusals.
A launcher's report of a signal and a step's cancellation come last but one: srun
terminates a step's other tasks when one fails, so they are a consequence wherever a
cause shows too; and where srun says it terminated the step, only what was logged before
that line can show them as a cause (after it, they are what srun did), so the error of
the task that failed is the cause even when no class names it.
"""

from __future__ import annotations

import re
from pathlib import Path

OK = "ok"
FAILURES = (
    "node_failure",
    "time_limit",
    "signal",
    "hang",
    "preempted",
    "out_of_memory",
    "disk_full",
    "cancelled",
    "nccl_error",
    "rendezvous_error",
    "missing_file",
    "checkpoint_error",
    "config_error",
    "error",
)
# Classes another attempt can get past: the job ran out of time, lost a node, was
# preempted or signalled, or the network failed. Out of memory, a missing file or a
# configuration the engine refuses fail the same way every time; a job a user cancelled
# stays cancelled. The launchers not meeting at their rendezvous (a wrong host, an
# interface that does not reach it) repeats too: it was an unnamed error before it had
# its class, and is not retried either. A hang (the segment's watchdog ended a launch
# that stopped progressing: a frozen rank, a stuck save or data loader) is retried like a
# node failure: most have a cause outside the job.
TRANSIENT = frozenset({"node_failure", "time_limit", "signal", "hang", "preempted", "nccl_error"})
# The line the segment's watchdog appends to the engine log when it ends a hung launch
# (hpcllm.training.campaign.watchdog): the signals it sent after it are its doing.
HANG_MARK = "hpcllm watchdog: hang"

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

_DEATH_SIGNAL = re.compile(r"Received (?:\d+|Signals\.SIG\w+) death signal|SignalException")
_STEP_CANCELLED = re.compile(r"\*\*\* STEP \S+ ON \S+ CANCELLED AT")
# What srun did to the step, not a cause, where srun terminated it (below).
_CONSEQUENCES = (_DEATH_SIGNAL, _STEP_CANCELLED)
# srun's line when it terminates a step: after a task of it failed (--kill-on-bad-exit,
# as every launch of hpcllm.launch asks), or when srun itself was told to stop.
_STEP_TERMINATED = re.compile(r"^srun: .*Terminating (?:StepId=|job step )", re.M)

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
    ("hang", re.compile(rf"^==> [\d: -]+ {HANG_MARK}", re.M)),
    (
        "signal",
        re.compile(
            # torch engine; Megatron-LM (--exit-signal-handler: its text whatever the
            # --exit-signal, training.py at the pin); the segment before the engine
            r"^exiting at iteration \d+ \(signal\)|exiting program after receiving SIGTERM|"
            r"exiting program at iteration \d+",
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
    (
        # a write that found no room: the errno's text, and torch.save's zip writer, which
        # reports a short write of a full file system as an unexpected position
        "disk_full",
        re.compile(
            r"No space left on device|Disk quota exceeded|\[Errno (?:28|122)\]|"
            r"PytorchStreamWriter failed writing file|unexpected pos \d+ vs \d+"
        ),
    ),
    # a job cancelled (scancel, preemption); a step's own "*** STEP ... CANCELLED AT" is
    # matched last but one, below
    (
        "cancelled",
        re.compile(r"\*\*\* JOB \d+\S* ON \S+ CANCELLED AT|scancel|PREEMPTION", re.I),
    ),
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
    # a checkpoint refused before it is read: damaged, unverified, or not loadable
    ("checkpoint_error", re.compile(r"CheckpointError: ")),
    (
        "config_error",
        re.compile(
            # Megatron-LM's argument checks (asserts in validate_args), our own refusals
            r"AssertionError|argparse|error: unrecognized arguments|error: argument|"
            r"ValueError: |DataError: |SettingsChanged: ",
        ),
    ),
    (
        # torchrun's c10d rendezvous and the TCP store of torch.distributed: the
        # processes of the job never met (a wrong host, an unreachable interface or port).
        # Only the messages of meeting, not DistNetworkError at large: a rank that fails
        # ends the others' store connections, which they log as one too; so does the
        # agent of a node whose peer ended ("has failed to shutdown the rendezvous ...
        # due to an error of type RendezvousConnectionError"): a consequence.
        "rendezvous_error",
        re.compile(
            r"(?<!due to an error of type )Rendezvous(?:Timeout|Connection)Error|"
            r"TCP client failed to connect|"
            r"The client socket has timed out after .* while trying to connect to|"
            r"Timed out after \d+ seconds waiting for clients|"
            r"The server socket has failed to (?:bind|listen)|"
            r"network addresses of \(.*\) cannot be retrieved"
        ),
    ),
    # torchrun (the elastic agent) signalled before its workers could act on it. After
    # the causes: where one node's task fails, srun terminates the step's other tasks
    # ("Terminating StepId"), whose torchrun logs this; the failed task's reason is
    # the cause. Alone (no cause in the log), the job was signalled.
    ("signal", _DEATH_SIGNAL),
    # slurmstepd's line for a step that srun terminated after one of its tasks failed:
    # a consequence, like the signal above; alone, the step was cancelled
    ("cancelled", _STEP_CANCELLED),
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
    # The signal and the cancellation that the other tasks logged after srun terminated
    # the step are its doing: a cause only before that line. A task of one node failed
    # at start-up (no class names its error) and srun ended the other node's: "error".
    terminated = _STEP_TERMINATED.search(text)
    before = text[: terminated.start()] if terminated else text
    for name, pattern in _PATTERNS:
        if pattern.search(before if pattern in _CONSEQUENCES else text):
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


# A process ended by SIGKILL (which it cannot catch, so it prints nothing): the shell's exit
# status 128 + 9, bash's report, torchrun's, Slurm's.
_SIGKILL = re.compile(
    r"Signal 9 \(SIGKILL\)|exitcode\s*:\s*-9\b|\bline \d+:\s+\d+ Killed\b|task \d+: Killed\b"
)


def killed_by_sigkill(returncode: int | None, text: str = "") -> bool:
    """Whether the launch (or a process in it) ended by SIGKILL."""
    return returncode in (137, -9) or _SIGKILL.search(text) is not None


def _memory_cgroup_file(proc_cgroup: str, root: str) -> Path | None:
    """This process's memory cgroup's OOM counter file (its Slurm job's, in a job): cgroup v2
    ``memory.events``, v1 ``memory.oom_control``; the mount's root inside a container that
    shows its own cgroup as the root."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            base, name = Path(root), "memory.events"
        elif "memory" in controllers.split(","):
            base, name = Path(root) / "memory", "memory.oom_control"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        jobs = [i for i, p in enumerate(parts) if p.startswith("job_")]
        if jobs:  # Slurm: the job's cgroup counts the kills in all its steps
            parts = parts[: jobs[0] + 1]
        for candidate in (base.joinpath(*parts) / name, base / name):
            if candidate.is_file():
                return candidate
    return None


def oom_kill_count(
    proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> int | None:
    """The kernel's count of processes it killed for memory in this job's cgroup (None
    where it cannot be read). Compared before and after a launch: a rise means the
    kernel's OOM killer ended a process of the launch."""
    path = _memory_cgroup_file(proc_cgroup, root)
    if path is None:
        return None
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    except OSError:
        return None
    return None


def slurm_step_state(job_id: str | None) -> str | None:
    """The state of the job's newest step as Slurm's accounting records it (``sacct``),
    e.g. OUT_OF_MEMORY; None without a job id, without accounting, or on any error."""
    import subprocess

    if not job_id:
        return None
    try:
        out = subprocess.run(
            ["sacct", "-n", "-P", "-j", job_id, "-o", "JobID,State"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    steps = []
    for line in out.stdout.splitlines():
        step, _, state = line.partition("|")
        number = step.rpartition(".")[2]
        if "." in step and number.isdigit():
            steps.append((int(number), state.strip()))
    return max(steps)[1] if steps else None
