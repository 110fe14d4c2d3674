"""Attempts of one training segment, and whether Snakemake's next attempt may run.

The ``train_segment`` rule has ``retries`` (``training.max_attempts`` - 1): Snakemake
resubmits a failed segment job, and the new job resumes from the newest checkpoint. Each
attempt leaves an entry in ``logs/train_segment/<experiment>/seg<k>.attempts.json``
(written when it starts, completed when it ends): its Slurm job id and host, the
checkpoint iteration it started from and reached, and its failure class
(:mod:`hpcllm.failures.classify`).

The next attempt runs only while attempts fail for a transient reason (time limit, node
failure, preemption, a signal, NCCL) and do not run out of time without progress. A
deterministic failure (out of memory, a missing file, a configuration the engine refuses)
stops the chain with its class and job id; so does an attempt that ran until its job's
time limit and trained no iteration (the runtime is too short for the start-up). An
attempt cut short from outside (preempted, its node failed, killed long before its time
limit) proves nothing about the runtime: the next attempt runs even when it trained
nothing. Progress is what the attempt trained (the iterations its engine logged), not only
what it saved: an engine killed between two saves trained, and the next attempt may well
reach the save. An attempt that left no end record (its batch host died, or the time limit
killed it) is classified from Slurm's state of its job, its progress from its part of the
engine log, and its end from the last renewal of its checkpoint-folder lease.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hpcllm.atomic import atomic_path
from hpcllm.failures.classify import classify_text, is_transient
from hpcllm.training.checkpoints import lease
from hpcllm.training.checkpoints.lease import squeue_job
from hpcllm.training.engines.log_lines import log_text_from, parse_log_lines


@dataclass
class Attempt:
    attempt: int
    job_id: str | None
    host: str
    start_iteration: int
    started: float
    reached_iteration: int | None = None  # None: the attempt never recorded its end
    failure: str | None = None  # None: complete (when reached_iteration is set)
    message: str = ""
    ended: float | None = None
    logged_iteration: int | None = None  # the last iteration its engine logged
    log_offset: int | None = None  # where its part of the engine log starts
    deadline: float | None = None  # when its job's time ends (None: no limit known)
    # seconds before the deadline from which the segment stops for time (its margin, or
    # Slurm's --signal): an attempt that ended before then did not run out of time
    time_lead: float | None = None
    # where the watchdog ended a hung launch (hpcllm.training.campaign.watchdog): its
    # bound, the phase, the ranks that stopped reporting (first first) and those waiting
    hang: dict | None = None
    # Slurm nodes this attempt's job was asked to avoid (--exclude): where an earlier
    # attempt of the same run hung, the node of its rank that stopped reporting first
    excluded: list | None = None


def suspect(hang: dict | None) -> dict | None:
    """The rank a hang's record holds responsible: the one that stopped reporting first
    (frozen, dead, its node gone), or where every rank was alive, the one that made no
    progress first (stuck in its save or its data loading, the others waiting for it in
    a barrier or the gradient all-reduce: hpcllm.training.campaign.watchdog orders them).
    None where the engine names no rank (Megatron-LM writes no heartbeats)."""
    if not hang:
        return None
    for kind in ("stopped", "waiting"):
        ranks = hang.get(kind) or []
        if ranks:
            return {**ranks[0], "stopped": kind == "stopped"}
    return None


def suspect_nodes(attempts: list[Attempt], attempt: int) -> list[str]:
    """The nodes attempt ``attempt`` should avoid: for each attempt before it in this run
    (:func:`current_chain`) that the watchdog ended as hung, the node of its suspect rank
    (:func:`suspect`; Slurm's node name, from its heartbeat). Where the engine names no
    rank, no node is suspect."""
    found: list[str] = []
    for a in current_chain(attempts):
        if a.attempt >= attempt or a.failure != "hang":
            continue
        host = (suspect(a.hang) or {}).get("host")
        if host and host not in found:
            found.append(host)
    return found


def excluded_nodes(slurm_extra: str) -> list[str]:
    """The nodes a job's ``slurm_extra`` asks Slurm to avoid (``--exclude=n2,n3``)."""
    found = re.findall(r"(?:^|\s)--exclude=(\S+)", slurm_extra or "")
    return [node for value in found for node in value.split(",") if node]


def hang_summary(entry: Attempt) -> str:
    """For an attempt the segment's watchdog ended, its suspect rank and what it was
    doing (``: rank 1 on n3 stopped reporting first, in 'step' at iteration 13``; ``: rank
    1 on n2 made no progress first, in 'save' at iteration 50 (every rank alive)``), for
    ``hpcllm status``; "" for any other attempt."""
    if not entry.hang:
        return ""
    first = suspect(entry.hang)
    if first is None:
        return ": no rank named (the engine writes no heartbeats)"
    if first.get("phase") is None:
        return f": rank {first['rank']} never reported"
    where = (
        f"in '{first['phase']}'{' (' + first['doing'] + ')' if first.get('doing') else ''} "
        f"at iteration {first['iteration']}"
    )
    if first["stopped"]:
        return f": rank {first['rank']} on {first['host']} stopped reporting first, {where}"
    return (
        f": rank {first['rank']} on {first['host']} made no progress first, {where} "
        "(every rank alive, the others waiting for it)"
    )


def attempts_path(engine_log: str | os.PathLike) -> Path:
    """``seg<k>.engine.log`` -> ``seg<k>.attempts.json`` next to it."""
    path = Path(engine_log)
    return path.with_name(path.name.split(".")[0] + ".attempts.json")


def load(path: str | os.PathLike) -> list[Attempt]:
    path = Path(path)
    if not path.is_file():
        return []
    return [Attempt(**entry) for entry in json.loads(path.read_text())]


def _save(path: str | os.PathLike, attempts: list[Attempt]) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps([asdict(a) for a in attempts], indent=2) + "\n")


def current_chain(attempts: list[Attempt]) -> list[Attempt]:
    """The attempts of the latest Snakemake run: from its attempt 1 on (earlier runs'
    entries stay in the file, for the GPU-hours ``hpcllm status`` adds up)."""
    starts = [i for i, a in enumerate(attempts) if a.attempt == 1]
    return attempts[starts[-1] :] if starts else attempts


def record_start(
    path,
    attempt: int,
    start_iteration: int,
    environ=os.environ,
    log_offset: int | None = None,
    deadline: float | None = None,
    time_lead: float | None = None,
    excluded: list[str] | None = None,
) -> Attempt:
    """Append this attempt's entry before anything runs."""
    entry = Attempt(
        attempt=attempt,
        job_id=environ.get("SLURM_JOB_ID"),
        host=socket.gethostname(),
        start_iteration=start_iteration,
        started=time.time(),
        log_offset=log_offset,
        deadline=deadline,
        time_lead=time_lead,
        excluded=excluded or None,
    )
    _save(path, [*load(path), entry])
    return entry


def record_end(
    path,
    entry: Attempt,
    reached: int,
    failure: str | None,
    message: str = "",
    logged: int | None = None,
    hang: dict | None = None,
):
    entry.reached_iteration, entry.failure, entry.message = reached, failure, message
    entry.logged_iteration, entry.hang = logged, hang
    entry.ended = time.time()
    _save(path, [entry if _same(a, entry) else a for a in load(path)])


def _same(a: Attempt, b: Attempt) -> bool:
    return (a.attempt, a.started, a.host) == (b.attempt, b.started, b.host)


def logged_iteration(engine_log: str | os.PathLike, offset: int = 0) -> int | None:
    """The last iteration the engine logged in ``engine_log`` from byte ``offset`` on."""
    text = log_text_from(engine_log, offset)
    if text is None:
        return None
    rows = parse_log_lines(text)
    return max(r["iteration"] for r in rows) if rows else None


def trained_to(entry: Attempt, engine_log: str | os.PathLike | None = None) -> int | None:
    """The last iteration attempt ``entry`` trained: recorded at its end, or read from its
    part of the engine log when it recorded no end (its host died with it)."""
    if entry.logged_iteration is not None or engine_log is None or entry.log_offset is None:
        return entry.logged_iteration
    return logged_iteration(engine_log, entry.log_offset)


def slurm_state(job_id: str | None) -> str | None:
    """The job's state as squeue still shows it (None without Slurm or once forgotten)."""
    proc = squeue_job(job_id) if job_id else None
    out = proc.stdout.strip() if proc else ""
    return out.split()[0] if out else None


def classify_unfinished(entry: Attempt, state: str | None) -> str:
    """The class of an attempt that recorded no end: from Slurm's state of its job.

    A job that Slurm forgot, or that shows no cause, most likely lost its batch host or
    hit its time limit: both transient, and the progress check still applies.
    """
    return classify_text("", state) or "node_failure"


def last_alive(entry: Attempt, save: str | os.PathLike | None) -> float | None:
    """When attempt ``entry`` ended: recorded at its end, or, when it recorded none (its
    host died with it), the last renewal of the checkpoint folder's lease it left behind
    (renewed every ``lease.RENEW_SECONDS``); None when neither tells."""
    if entry.ended is not None:
        return entry.ended
    holder = lease.read(save) if save is not None else None
    if holder and (holder.job_id, holder.host) == (entry.job_id, entry.host):
        return holder.renewed
    return None


def ran_out_of_time(
    entry: Attempt, state: str | None, save: str | os.PathLike | None = None
) -> bool | None:
    """Whether attempt ``entry`` ran until its job's time limit (True) or was cut short
    from outside (False: Slurm's state says preempted or node failure, the segment's
    watchdog ended it as hung, or it ended well before its time limit: a kill, a crash of
    its node); None when nothing tells. Outside Slurm no time limit stops a segment."""
    slurm = classify_text("", state)
    if slurm in ("preempted", "node_failure") or entry.failure == "hang":
        return False
    if slurm == "time_limit" or entry.failure == "time_limit":
        return True
    ended = last_alive(entry, save)
    if ended is None:
        return None
    if entry.deadline is None:
        return False if entry.job_id is None else None  # a Slurm job of unknown limit
    # slack: the lease's renewal period (an end read from the lease is up to that early)
    return ended >= entry.deadline - (entry.time_lead or 0) - lease.RENEW_SECONDS


def refusal(
    attempts: list[Attempt],
    attempt: int,
    latest_iteration: int,
    state_of=slurm_state,
    engine_log: str | os.PathLike | None = None,
    save: str | os.PathLike | None = None,
) -> str | None:
    """Why attempt ``attempt`` must not run (a message naming class and job id), or None.
    ``engine_log`` gives the iterations of an attempt that recorded no end, and the lease
    in the checkpoint folder ``save`` when it ended."""
    if attempt <= 1:
        return None
    previous = [a for a in current_chain(attempts) if a.attempt < attempt]
    if not previous:
        return None
    last = max(previous, key=lambda a: a.attempt)
    job = f"job {last.job_id}" if last.job_id else f"the process on {last.host}"
    failure = last.failure
    state = state_of(last.job_id) if last.job_id else None
    if last.reached_iteration is None:
        failure = classify_unfinished(last, state)
    elif classify_text("", state) in ("cancelled", "preempted"):
        # The job caught the SIGTERM and recorded "signal": Slurm knows whose it was.
        failure = classify_text("", state)
    if failure is not None and not is_transient(failure):
        return (
            f"attempt {last.attempt} ({job}) failed with {failure}, which another attempt "
            f"would repeat: {(last.message or 'see its logs').rstrip('. ')}. Fix the cause "
            "and rerun."
        )
    trained = trained_to(last, engine_log)
    if max(latest_iteration, trained or 0) > last.start_iteration:
        return None
    ran_out = ran_out_of_time(last, state, save)
    if ran_out is False:
        return None  # cut short from outside: it says nothing about the next attempt
    how = "ran until its time limit and" if ran_out else "was not seen cut short from outside, and"
    return (
        f"attempt {last.attempt} ({job}, {failure or 'no class'}) {how} added no iteration "
        f"(its engine trained none past iteration {last.start_iteration}, the checkpoint "
        f"is still at iteration {latest_iteration}): a further attempt would most likely "
        "do the same. Give the segment a longer runtime or look at its logs, then rerun."
    )
