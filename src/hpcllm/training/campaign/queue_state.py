"""When our next job could start, from the partition's queue as it is now.

``squeue --start`` names only jobs already pending with their dependency met; the next
segment's job of a chain is not yet either. Its wait comes from the other jobs on the
partition (``squeue -p <partition>`` for all users: running ones with their time limit
and elapsed time, pending ones with their size and limit) and the partition's usable
nodes (``sinfo -p <partition> -o %F``), by placing them first come, first served
(:func:`start_after`):

- high: every other job runs to its limit (what ``squeue --start`` assumes);
- central: a running job ends after :data:`EARLY_END_SHARE` of what its limit leaves
  it, a pending one runs that share of its limit;
- low: :data:`EARLY_END_SHARE_LOW` of them.

Users' jobs end before their limits (the issue's premise; the test cluster's background
jobs of benchmarks/forecast_calibration.py end at 8-75 % of theirs). The shares are
assumptions, said so in the forecast line: nothing here measured a site's users.

Jobs that arrive later are not in the queue now: the measured waits count them
(hpcllm.training.campaign.calendar combines both). The parsers are pure; the readers
return None where Slurm cannot be asked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hpcllm.training.campaign.queue_times import TIMEOUT_S, slurm_output

# share of their time limit that other users' jobs run (see the module's docstring)
EARLY_END_SHARE = 0.5
EARLY_END_SHARE_LOW = 0.1
SHARES = {"low": EARLY_END_SHARE_LOW, "central": EARLY_END_SHARE, "high": 1.0}
SQUEUE_FORMAT = "%i|%T|%D|%l|%M|%Q"


@dataclass(frozen=True)
class QueueJob:
    """One job on the partition, as ``squeue -o %i|%T|%D|%l|%M|%Q`` prints it."""

    id: str
    state: str  # RUNNING, PENDING, ...
    nodes: int
    limit_s: float | None  # None: no limit (UNLIMITED, NOT_SET)
    elapsed_s: float
    priority: float | None = None  # Slurm's: pending jobs start in its order


@dataclass(frozen=True)
class QueueState:
    """The partition's jobs (ours included: the forecast leaves its own out) and usable
    nodes, read at ``at``."""

    at: float
    nodes: int
    jobs: tuple[QueueJob, ...]
    partition: str


def slurm_duration(text: str) -> float | None:
    """Seconds of Slurm's ``[days-]hours:minutes:seconds`` (or ``minutes:seconds``); None
    for UNLIMITED, NOT_SET, INVALID and anything else that is no duration."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if not m:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def parse_jobs(text: str) -> list[QueueJob]:
    """Lines of ``squeue -h -o %i|%T|%D|%l|%M|%Q`` (without ``%Q``: no priority; other
    lines are skipped)."""
    out = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 5:
            parts.append("")
        if len(parts) != 6 or not parts[2].strip().isdigit():
            continue
        try:
            priority = float(parts[5])
        except ValueError:
            priority = None
        out.append(
            QueueJob(
                id=parts[0].strip(),
                state=parts[1].strip(),
                nodes=int(parts[2]),
                limit_s=slurm_duration(parts[3]),
                elapsed_s=slurm_duration(parts[4]) or 0.0,
                priority=priority,
            )
        )
    return out


def parse_usable_nodes(text: str) -> int | None:
    """The nodes of ``sinfo -h -o %F`` (allocated/idle/other/total) that can run jobs:
    total less other (down, drained); summed over its lines. None: nothing readable."""
    found = None
    for line in text.splitlines():
        m = re.fullmatch(r"(\d+)/(\d+)/(\d+)/(\d+)", line.strip())
        if m:
            found = (found or 0) + int(m.group(4)) - int(m.group(3))
    return found


def start_after(
    others: Iterable[QueueJob],
    nodes: int,
    need: int,
    eligible_in: float,
    share: float,
    ours_running: int = 0,
) -> float | None:
    """Seconds from the queue's reading until a job of ``need`` nodes, eligible
    ``eligible_in`` seconds after it, starts on a partition of ``nodes`` nodes, where the
    ``others`` run ``share`` of their limits (one without a limit: to no end) and our
    running job holds ``ours_running`` nodes until it becomes eligible. First come, first
    served: the pending jobs (in squeue's order, its priority's) go first, none overtakes.
    None: it never fits (more nodes than the partition's, a job without a limit ahead)."""
    if need > nodes:
        return None
    inf = float("inf")
    free_at: list[float] = []  # per node: when it is free
    pending = []
    for job in others:
        if job.state == "RUNNING":
            # the share of what its limit leaves: a job that has run long already is not
            # about to end for it (runs spread up to the limit, as users' jobs do)
            end = inf if job.limit_s is None else share * max(0.0, job.limit_s - job.elapsed_s)
            free_at += [end] * job.nodes
        elif job.state == "PENDING":
            pending.append(job)
    free_at += [max(0.0, eligible_in)] * ours_running
    free_at = sorted(free_at)[:nodes]
    free_at += [0.0] * (nodes - len(free_at))
    earliest = 0.0  # first come, first served: no job starts before one ahead of it
    for job in pending:
        if job.nodes > nodes:
            continue  # it never runs here: Slurm leaves it pending, others pass it
        free_at.sort()
        start = max(earliest, free_at[job.nodes - 1])
        if start == inf:
            return None
        run = inf if job.limit_s is None else share * job.limit_s
        for i in range(job.nodes):
            free_at[i] = start + run
        earliest = start
    free_at.sort()
    start = max(earliest, free_at[need - 1], eligible_in)
    return None if start == inf else start


def start_range(
    state: QueueState, mine: Sequence[str], need: int, eligible_at: float
) -> dict[str, float] | None:
    """When our next job starts (epoch seconds) by side (low, central, high), if it is
    eligible (its dependency met) at ``eligible_at`` (from now on at the earliest), with
    the partition as ``state`` read it; the jobs of ``mine`` (this campaign's) are ours:
    the running one holds its nodes until then, a pending one is the job itself: the other
    pending jobs of lower priority than it are behind it (Slurm starts pending jobs in
    priority order; by submission under priority/basic: a chain's next job, submitted when
    its predecessor started, goes before the jobs submitted after it). None where it
    never fits."""
    ours = set(mine)
    others = [j for j in state.jobs if j.id not in ours and _ahead(j, state.jobs, ours)]
    ours_running = sum(j.nodes for j in state.jobs if j.id in ours and j.state == "RUNNING")
    eligible_in = max(0.0, eligible_at - state.at)
    out = {}
    for side, share in SHARES.items():
        start = start_after(others, state.nodes, need, eligible_in, share, ours_running)
        if start is None:
            return None
        out[side] = state.at + start
    return out


def _ahead(job: QueueJob, jobs: Sequence[QueueJob], ours: set[str]) -> bool:
    """A running job, or a pending one our next job (our pending job of highest
    priority; none pending: every pending job is ahead) does not go before."""
    if job.state != "PENDING":
        return True
    mine = [j.priority for j in jobs if j.id in ours and j.state == "PENDING"]
    if not mine or None in mine or job.priority is None:
        return True
    return job.priority > max(p for p in mine if p is not None)


def describe(state: QueueState, mine: Sequence[str]) -> str:
    """``the queue now: 3 other jobs on batch's 2 nodes (2 running, 1 pending)``."""
    ours = set(mine)
    others = [j for j in state.jobs if j.id not in ours]
    running = sum(1 for j in others if j.state == "RUNNING")
    pending = [j for j in others if j.state == "PENDING"]
    ahead = sum(1 for j in pending if _ahead(j, state.jobs, ours))
    behind = f", {len(pending) - ahead} of them behind ours" if ahead < len(pending) else ""
    return (
        f"the queue now: {len(others)} other job{'s' * (len(others) != 1)} on "
        f"{state.partition}'s {state.nodes} node{'s' * (state.nodes != 1)} ({running} "
        f"running, {len(pending)} pending{behind}; assumed to end at {EARLY_END_SHARE:.0%} "
        f"of their limits, {EARLY_END_SHARE_LOW:.0%} to all)"
    )


def read(partition: str, now: float, timeout: float = TIMEOUT_S) -> QueueState | None:
    """The partition's jobs of all users (one squeue call) and usable nodes (one sinfo
    call), each given ``timeout`` seconds; None where either cannot be read."""
    jobs = slurm_output(["squeue", "-h", "-p", partition, "-o", SQUEUE_FORMAT], timeout)
    if jobs is None:
        return None
    sinfo = slurm_output(["sinfo", "-h", "-p", partition, "-o", "%F"], timeout)
    nodes = parse_usable_nodes(sinfo or "")
    if not nodes:
        return None
    return QueueState(at=now, nodes=nodes, jobs=tuple(parse_jobs(jobs)), partition=partition)
