"""The segment's hang watchdog: ends an engine's launch that made no progress for longer
than a bound, well before Slurm's time limit, and says who stopped first.

Progress is (a) a rank's heartbeat file (:mod:`hpcllm.training.engines.heartbeat`, the
torch engine's: every phase change counts) and (b) a new iteration or save line in the
engine log (Megatron-LM, which we do not modify, writes no heartbeat; before the first
iteration any new output counts: its start-up prints as it goes).

The bound follows what the job's phase needs, from the newest segment record's measured
``iteration_seconds`` and ``save_seconds`` (:func:`measured_times`): ``FACTOR`` times the
gap between two signs of progress (an iteration with heartbeats; ``log_interval`` +
``eval_iters`` iterations from the log alone, also where no rank rewrites its heartbeat
any more; a save), never below the cluster's
``watchdog.floor_seconds`` nor above its ``ceiling_seconds``. Before anything was measured
(the first segment, the start-up of every attempt, a first save) the bound is the
ceiling: a slow but progressing segment is never ended, since every sign of progress
starts the clock again.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcllm.clusters import SILENT_BEATS
from hpcllm.failures.classify import HANG_MARK
from hpcllm.training.checkpoints.tracker import newest_kept_record
from hpcllm.training.engines.heartbeat import DIR_ENV, PHASES, SECONDS_ENV, read_heartbeats
from hpcllm.training.engines.log_lines import parse_log_lines

# A gap this many times the measured one is no longer slowness: a busier file system or
# a slower node rarely costs more than twice; four leaves room for both.
FACTOR = 4

# The engine log's line for a launch the watchdog ended (its class: hang).
LOG_MARK = HANG_MARK

# Megatron-LM's lines around a save (megatron/training/checkpointing.py at the pin; the
# torch engine prints the second one too).
_SAVING = "saving checkpoint at iteration"
_SAVED = "successfully saved checkpoint"


@dataclass(frozen=True)
class Bounds:
    """Seconds without progress after which the watchdog ends the launch, per phase."""

    start: float  # before the attempt's first iteration
    step: float  # training (data, step, sync, eval), seen in heartbeats
    save: float
    reason: dict[str, str] = field(default_factory=dict)  # phase -> where it comes from
    # training seen in the engine log alone (None: as ``step``): where no heartbeat is
    # written any more (every rank frozen, or a file system refusing the files)
    step_log: float | None = None

    def of(self, phase: str, heartbeats: bool = True) -> float:
        step = self.step if heartbeats or self.step_log is None else self.step_log
        return {"start": self.start, "save": self.save}.get(phase, step)

    def describe(self, phase: str, heartbeats: bool = True) -> str:
        kind = "start" if phase == "start" else "save" if phase == "save" else "step"
        if kind == "step" and not heartbeats and self.step_log is not None:
            kind = "step_log"
        return f"{self.of(phase, heartbeats):.0f} s ({self.reason.get(kind, '')})"


def measured_times(save: str | Path) -> dict[str, Any] | None:
    """The newest segment record kept in the checkpoint folder (``chain/seg<k>.json``)
    with a measured ``iteration_seconds`` (and ``save_seconds`` where it has one); None
    before the first one."""
    return newest_kept_record(save, "iteration_seconds")


def bounds(
    facts,
    found: dict[str, Any] | None,
    heartbeats: bool,
    log_interval: int = 1,
    eval_iters: int = 0,
) -> Bounds:
    """The bounds for a segment on a cluster with watchdog ``facts`` (floor, ceiling),
    from the measured times ``found`` (:func:`measured_times`; None: nothing measured).
    ``heartbeats``: the engine's ranks report each iteration (the step's bound covers an
    iteration); its log lines come every ``log_interval`` iterations, and none during an
    evaluation of ``eval_iters`` (the bound from the log alone covers both)."""
    floor, ceiling = facts.floor_seconds, facts.ceiling_seconds

    def clamp(needed: float) -> float:
        return float(min(ceiling, max(floor, math.ceil(needed))))

    generous = "the ceiling, as nothing was measured yet"
    reason = {"start": f"the ceiling {ceiling:g} s: a start-up is never measured"}
    iteration = (found or {}).get("iteration_seconds")
    step_log = None
    if iteration:

        def gap(per: int) -> tuple[float, str]:
            what = "an iteration" if per == 1 else f"{per} iterations"
            return clamp(FACTOR * per * iteration), (
                f"{FACTOR} x {what} of {iteration:g} s measured in segment "
                f"{found['segment']}, within floor {floor:g} s and ceiling {ceiling:g} s"
            )

        logged = max(1, log_interval) + max(0, eval_iters)
        step, reason["step"] = gap(1 if heartbeats else logged)
        if heartbeats:
            step_log, reason["step_log"] = gap(logged)
            reason["step_log"] += ", from the engine log alone: no heartbeat written"
    else:
        step, reason["step"] = ceiling, generous
    saved = (found or {}).get("save_seconds")
    if saved:
        save = clamp(FACTOR * saved)
        reason["save"] = (
            f"{FACTOR} x the save of {saved:g} s measured in segment {found['segment']}, "
            f"within floor {floor:g} s and ceiling {ceiling:g} s"
        )
    else:
        save, reason["save"] = ceiling, generous
    return Bounds(start=float(ceiling), step=step, save=save, reason=reason, step_log=step_log)


@dataclass
class _Rank:
    beat: dict[str, Any]
    changed: float  # when the watchdog last saw its file change (its clock)
    progressed: float  # when it last saw the rank's progress count change


@dataclass
class Stall:
    """A launch the watchdog ended: how long nothing progressed, the bound, the phase,
    the ranks that stopped reporting (first first) and those alive but waiting (the
    first to stop progressing first)."""

    quiet_seconds: float
    bound_seconds: float
    phase: str
    bound_reason: str
    stopped: list[dict[str, Any]]
    waiting: list[dict[str, Any]]
    log_phase: str | None = None

    def as_record(self) -> dict[str, Any]:
        return {
            "quiet_seconds": round(self.quiet_seconds, 1),
            "bound_seconds": self.bound_seconds,
            "phase": self.phase,
            "stopped": self.stopped,
            "waiting": self.waiting,
        }

    def describe(self) -> str:
        text = (
            f"no progress for {self.quiet_seconds:.0f} s, beyond the watchdog's bound of "
            f"{self.bound_reason} in phase '{self.phase}'"
        )
        if self.stopped:
            first, *rest = self.stopped
            text += f"; {_rank_text(first)} stopped reporting first"
            if rest:
                text += "; then " + ", ".join(_rank_text(r) for r in rest)
        if self.waiting and not self.stopped:  # all alive: who stopped progressing first
            first, *rest = self.waiting
            text += f"; every rank alive; {_rank_text(first)} made no progress first"
            if rest:
                text += "; then waiting: " + ", ".join(_rank_text(r) for r in rest)
        elif self.waiting:
            text += "; alive but waiting: " + ", ".join(_rank_text(r) for r in self.waiting)
        if not self.stopped and not self.waiting:
            text += (
                "; the engine writes no per-rank heartbeat (Megatron-LM), so which rank hung "
                f"is not known; its log's last phase: {self.log_phase or 'start'}"
            )
        return text


def _rank_text(rank: dict[str, Any]) -> str:
    if rank.get("phase") is None:
        return f"rank {rank['rank']} (never reported)"
    silent = rank.get("silent_seconds")
    when = f", silent for {silent:.0f} s" if silent is not None else ""
    return (
        f"rank {rank['rank']} on {rank['host']} (pid {rank['pid']}, in '{rank['phase']}'"
        f"{' (' + rank['doing'] + ')' if rank.get('doing') else ''} "
        f"at iteration {rank['iteration']}{when})"
    )


class Watchdog:
    """Called every few seconds while the launch runs (:meth:`check`); returns a
    :class:`Stall` once nothing progressed for longer than the bound of the phase."""

    def __init__(
        self,
        limits: Bounds,
        engine_log: str | Path,
        heartbeat_dir: str | Path | None,
        ranks: int,
        heartbeat_seconds: float,
        log_offset: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.limits = limits
        self.engine_log = Path(engine_log)
        self.heartbeat_dir = Path(heartbeat_dir) if heartbeat_dir else None
        self.ranks = ranks
        self.silent_after = SILENT_BEATS * heartbeat_seconds
        self.clock = clock
        self.offset = log_offset if log_offset is not None else _size(self.engine_log)
        self.last_progress = clock()
        self.log_phase: str | None = None  # None: no iteration logged yet
        self.seen: dict[int, _Rank] = {}
        self.stall: Stall | None = None

    def phase(self) -> str:
        """The job's phase for its bound: the most generous of the ranks' and the log's."""
        phases = {r.beat.get("phase") for r in self.seen.values()}
        if self.log_phase is not None:
            phases.add(self.log_phase)
        started = self.log_phase is not None or any(p not in (None, "start") for p in phases)
        if not started:
            return "start"
        phases.discard(None)
        known = sorted(phases, key=lambda p: PHASES.index(p) if p in PHASES else len(PHASES))
        return max(known, key=self.limits.of)  # of equals, the first in PHASES

    def heartbeats_written(self, now: float) -> bool:
        """Whether some rank still rewrites its heartbeat file: then the heartbeats' bound
        holds. Where none does (every rank frozen or gone, or the file system refuses the
        files while the training goes on), progress shows in the engine log alone."""
        return any(now - r.changed <= self.silent_after for r in self.seen.values())

    def check(self) -> Stall | None:
        now = self.clock()
        if self._read_log() | self._read_heartbeats(now):
            self.last_progress = now
        quiet = now - self.last_progress
        phase = self.phase()
        beating = self.heartbeats_written(now)
        if quiet <= self.limits.of(phase, beating):
            return None
        self.stall = self._stall(now, quiet, phase, beating)
        return self.stall

    def _read_log(self) -> bool:
        try:
            with open(self.engine_log, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return False
        complete = data[: data.rfind(b"\n") + 1]  # a line being written waits
        self.offset += len(complete)
        if not complete:
            return False
        progressed = self.log_phase is None  # during the start-up any output counts
        for line in complete.decode("utf-8", errors="replace").splitlines():
            if _SAVING in line:
                self.log_phase, progressed = "save", True
            elif _SAVED in line or parse_log_lines(line):
                self.log_phase, progressed = "step", True
        return progressed

    def _read_heartbeats(self, now: float) -> bool:
        if self.heartbeat_dir is None:
            return False
        progressed = False
        for rank, beat in read_heartbeats(self.heartbeat_dir).items():
            old = self.seen.get(rank)
            if old is None:
                self.seen[rank] = _Rank(beat, now, now)
                progressed = True
            elif beat != old.beat:
                if beat.get("progress") != old.beat.get("progress"):
                    old.progressed, progressed = now, True
                old.beat, old.changed = beat, now
        return progressed

    def _stall(self, now: float, quiet: float, phase: str, beating: bool) -> Stall:
        stopped, waiting = [], []
        for _, seen in sorted(self.seen.items()):
            entry = {k: seen.beat.get(k) for k in ("rank", "host", "pid", "phase", "iteration")}
            if seen.beat.get("doing"):  # the start-up's step
                entry["doing"] = seen.beat["doing"]
            silent = now - seen.changed
            if silent > self.silent_after:
                stopped.append({**entry, "silent_seconds": round(silent, 1)})
            else:
                waiting.append(entry)
        # the alive ones: the first to stop progressing first (a rank stuck in a save or
        # its data while its heartbeat thread runs on, the others waiting for it); of
        # those seen progressing in the same poll, the one with the fewest phase changes
        # (every rank makes the same ones): it is behind, the others wait for it
        waiting.sort(
            key=lambda r: (
                self.seen[r["rank"]].progressed,
                self.seen[r["rank"]].beat.get("progress", 0),
                r["rank"],
            )
        )
        # longest silent first; then the one whose own last beat is oldest
        stopped.sort(key=lambda r: (-r["silent_seconds"], self.seen[r["rank"]].beat.get("time", 0)))
        if self.seen:  # ranks that never wrote a heartbeat at all
            stopped += [
                {"rank": r, "host": None, "pid": None, "phase": None, "iteration": None}
                for r in range(self.ranks)
                if r not in self.seen
            ]
        return Stall(
            quiet_seconds=quiet,
            bound_seconds=self.limits.of(phase, beating),
            phase=phase,
            bound_reason=self.limits.describe(phase, beating),
            stopped=stopped,
            waiting=waiting,
            log_phase=self.log_phase,
        )


def segment_bounds(experiment: dict[str, Any], facts, save: str | Path) -> Bounds:
    """The bounds of the next segment of ``experiment`` checkpointing to ``save``: from
    its newest measured record, with heartbeats where the engine writes them (torch)."""
    return bounds(
        facts,
        measured_times(save),
        heartbeats=experiment["engine"] == "torch",
        log_interval=int(experiment.get("log_interval") or 1),
        eval_iters=int(experiment.get("eval_iters") or 0),
    )


def for_segment(
    experiment: dict[str, Any], facts, save: str | Path, engine_log: str | Path, ranks: int
) -> tuple[Watchdog, dict[str, str]]:
    """The watchdog of a segment's launch on a cluster with watchdog ``facts``, and the
    environment that has the torch engine's ``ranks`` write their heartbeats (none for
    Megatron-LM: its log lines are its progress)."""
    heartbeats = experiment["engine"] == "torch"
    limits = segment_bounds(experiment, facts, save)
    folder = fresh_heartbeat_dir(engine_log).resolve() if heartbeats else None
    env = {DIR_ENV: str(folder), SECONDS_ENV: f"{facts.heartbeat_seconds:g}"} if folder else {}
    return Watchdog(limits, engine_log, folder, ranks, facts.heartbeat_seconds), env


def heartbeat_dir(engine_log: str | Path) -> Path:
    """``seg<k>.engine.log`` -> ``seg<k>.heartbeats/`` beside it (on the shared file
    system, where every node's ranks write and the segment's host reads)."""
    path = Path(engine_log)
    return path.with_name(path.name.split(".")[0] + ".heartbeats")


def fresh_heartbeat_dir(engine_log: str | Path) -> Path:
    """The heartbeat folder, emptied: a previous attempt's files are not this one's."""
    folder = heartbeat_dir(engine_log)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
