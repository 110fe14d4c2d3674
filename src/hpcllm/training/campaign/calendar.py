"""When a training campaign will finish: a date with an 80 % interval, and how earlier
predictions fared.

The finish is laid out segment by segment from four measured things, each with a low and
a high end:

- seconds per iteration: the campaign's own segments once any ran (the median of each
  segment's logged iteration times), weighed newest first (:func:`newest_weighted`), the
  running segment's speed now (its newest logged iterations) the newest once it logged
  a few, and its own iterations left at it; the range: the slowest and fastest of them,
  or with one segment the 10th and 90th percentile of its iterations, at least
  :data:`MEASURED_RATE_SPREAD`; else the running segment's own logged iterations, else
  what ``layout: auto``'s measuring job timed for the layout it chose, else the plan's
  model rate (:func:`model_rate`; assumed spreads for both, said so);
- each segment's start-up and save: its job's time from Slurm's start to the record,
  less its iterations at its rate (weighed newest first), else the running job's own
  start-up (save assumed as long), else the canary's segments (a tiny model: a real one
  loads and saves longer), else :data:`DEFAULT_OVERHEAD_S`;
- each job's own queue wait: the next job's from the partition's queue now
  (:mod:`queue_state`: other users' jobs, their sizes and limits), a pending job's
  ``squeue --start`` time its high end (it counts other jobs' whole limits); without the
  queue, a pending job's between at once and its ``squeue --start`` time; the later ones
  the campaign's own measured waits (the running job's included; median, range shortest
  to longest) with the queue now as one more, from when the job could start, so that a
  forecast moves only when something but the clock does; else unknown: not included,
  and said so;
- the iterations left: the running job's by its own progress, then one job per segment.

The interval adds the parts' moves as independent errors (:func:`forecast`), then is
widened where the campaign's own earlier predictions missed by more
(:func:`calibrate`: split-conformal, on each side).

Each segment's job makes status's prediction at its start (itself the running job, its
partition's queue and its chain's pending successor read from its node:
:func:`read_job_queue`) and writes it into its record
(``timing.prediction``, and a line in ``checkpoints/<exp>/chain/predictions.jsonl``,
which is only ever appended to), with when the job was submitted, started and ended, so
that the results page can set each prediction against what happened.

``sshare``/``sprio`` (fair share, priority) are not read: no site file here says they are
open to users, and the wait they would explain is what ``squeue --start`` and the measured
waits give directly.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcllm.training.campaign.queue_state import QueueState

log = logging.getLogger(__name__)

# Start-up and save of a segment where nothing measured them: an assumption, said so.
DEFAULT_OVERHEAD_S = 300.0
# The range is meant as an 80 % interval: the actual end inside it in at least 4 of 5
# predictions (measured: benchmarks/calendar_calibration.py, docs/measurements/training.md).
INTERVAL = 0.8
# The least spread either side of a rate or a start-up and save, where what was measured
# spreads less (one segment; segments of one speed): speeds drift (other jobs on the
# network and file system) and start-up and save with them; on the loaded test cluster
# later segments' start-up and save ran up to 1.5 times the first's
# (benchmarks/forecast_calibration.py, docs/measurements/training.md).
MEASURED_RATE_SPREAD = 0.10
MEASURED_OVERHEAD_SPREAD = 0.5
# Rates nothing of this campaign measured: layout: auto's few iterations, and the plan's
# model (FLOPs at an assumed or benchmarked TFLOP/s; it ranks layouts, issue 48 found it up
# to 19 % off the layout table's own prediction): assumed spreads, said so in the line.
LAYOUT_RATE_SPREAD = 0.10
MODEL_RATE_SPREAD = 0.25
# The running segment's speed now: the median of its newest quarter of logged iterations
# (at least RUNNING_MIN_ROWS of them), for its own iterations left; and the newest of
# the speeds the later segments are rated by. Each segment's speed (and start-up and save)
# weighs NEWEST_WEIGHT against all before it: a speed that changed partway (other jobs on
# the node, the file system, a slower node) is followed within a segment or two, where the
# median of all segments kept the old one (benchmarks/forecast_calibration.py, runs 8-9).
RECENT_SHARE = 0.25
RUNNING_MIN_ROWS = 5
NEWEST_WEIGHT = 0.5
PREDICTIONS = "predictions.jsonl"
# Each side of the interval holds this share of the campaign's own past errors on its
# side (late, early): two tails of 10 % leave the 80 % between them.
CALIBRATION_TAIL = 0.9


@dataclass(frozen=True)
class Rate:
    seconds: float  # per iteration
    low: float
    high: float
    source: str  # e.g. "2.41 s/iteration over 3 segments, the newest weighted most"
    # the running segment's speed now, for its own iterations left (None: ``seconds``)
    current: float | None = None


@dataclass(frozen=True)
class Overhead:
    seconds: float  # per segment: start-up and save
    source: str
    low: float | None = None  # None: seconds
    high: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "low", self.seconds if self.low is None else self.low)
        object.__setattr__(self, "high", self.seconds if self.high is None else self.high)


@dataclass(frozen=True)
class Wait:
    seconds: float | None  # per job still to start; None: unknown
    low: float | None
    high: float | None
    source: str
    jobs: int = 0  # how many measured waits it stands for


@dataclass(frozen=True)
class Measured:
    """One trained segment, from its record's ``timing``."""

    segment: int
    iterations: int
    seconds_per_iteration: float | None
    p10: float | None
    p90: float | None
    job_seconds: float | None  # its job's start to its record
    wait_seconds: float | None  # the previous segment's end (or its submission) to its start
    ended: float | None


@dataclass(frozen=True)
class Forecast:
    now: float
    finish: float
    low: float
    high: float
    # the central end of each segment left, in order: the model's (calibrate moves only
    # the finish)
    segment_ends: tuple[float, ...]
    rate: Rate
    overhead: Overhead
    wait: Wait
    jobs_left: int  # jobs still to start
    segments_left: int
    squeue_starts: int = 0  # of the jobs still to start, those squeue --start gave a time
    running: bool = False  # the first segment left is being trained
    # the next job's start from the partition's queue now (queue_state): its wait, central,
    # low, high (from when it can start), and what the queue held
    queue_wait: tuple[float, float, float] | None = None
    queue: str | None = None
    calibration: str | None = None  # how the campaign's past errors widened the interval


# ---- measuring (in the segment's job)


def _seconds(rows: Iterable[Mapping[str, Any]]) -> list[float]:
    """The seconds per iteration of the engine log lines that logged one, in log order."""
    ms = (r.get("elapsed time per iteration (ms)") for r in rows)
    return [x / 1000 for x in ms if isinstance(x, float) and x > 0]


def iteration_times(rows: Iterable[Mapping[str, Any]]) -> dict[str, float] | None:
    """Median, 10th and 90th percentile of the seconds per iteration of engine log lines."""
    values = sorted(_seconds(rows))
    if not values:
        return None

    def share(q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))]

    return {
        "seconds_per_iteration": round(statistics.median(values), 6),
        "p10": round(share(0.1), 6),
        "p90": round(share(0.9), 6),
    }


def running_times(rows: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
    """:func:`iteration_times` of the running segment's rows (in log order) so far, with
    ``iterations`` (how many rows), ``recent``: the median of its newest
    :data:`RECENT_SHARE` of them (at least :data:`RUNNING_MIN_ROWS`): its speed now, and
    ``mean``: their mean (times the iterations they stand for: the time they took)."""
    values = _seconds(rows)
    if not values:
        return None
    newest = values[-max(RUNNING_MIN_ROWS, int(len(values) * RECENT_SHARE)) :]
    return {
        **iteration_times(rows),
        "iterations": len(values),
        "recent": round(statistics.median(newest), 6),
        "mean": round(statistics.fmean(values), 6),
    }


def newest_weighted(values: Sequence[float]) -> float:
    """The mean of ``values`` (oldest first) with weights halving back from the newest
    (:data:`NEWEST_WEIGHT`): the newest counts as much as all before it together."""
    out = values[0]
    for v in values[1:]:
        out = (1 - NEWEST_WEIGHT) * out + NEWEST_WEIGHT * v
    return out


def measured(records: Sequence[Mapping[str, Any]]) -> list[Measured]:
    """What the records of trained segments measured (records without ``timing``, of jobs
    that trained nothing or of older versions, are left out), in segment order."""
    out, previous_end = [], None
    for rec in sorted(records, key=lambda r: r.get("segment", 0)):
        timing = rec.get("timing")
        if not isinstance(timing, Mapping) or rec.get("trained_by_this_job") is False:
            continue
        job = timing.get("job") or {}
        started = job.get("started") or timing.get("training_started")
        ended = timing.get("ended")
        wait = None
        if job.get("started") is not None:
            # from when it could start: its dependency met (eligible), else its submission,
            # never before the previous segment's end. Not from that end alone: a job
            # submitted later (the controller was stopped) did not wait in the queue then.
            since = [t for t in (job.get("eligible") or job.get("submitted"), previous_end) if t]
            if since:
                wait = max(0.0, job["started"] - max(since))
        iterations = rec.get("last_iteration", 0) - rec.get("resumed_from_iteration", 0)
        out.append(
            Measured(
                segment=rec.get("segment", 0),
                iterations=max(0, iterations),
                seconds_per_iteration=timing.get("seconds_per_iteration"),
                p10=timing.get("p10"),
                p90=timing.get("p90"),
                job_seconds=ended - started if started is not None and ended else None,
                wait_seconds=wait,
                ended=ended,
            )
        )
        previous_end = ended
    return out


# ---- the parts of a forecast


def layout_measurement(name: str, workdir: str | os.PathLike = ".") -> tuple[float, int] | None:
    """Seconds per iteration and nodes of the layout ``layout: auto``'s measuring job chose
    for experiment ``name`` (results/layout/<name>.json), None where it has not run."""
    from hpcllm.training.plan.autolayout import load_record, record_path

    try:
        record = load_record(record_path(name, workdir))
    except Exception:  # noqa: BLE001  (a broken record is the plan's to refuse, not ours)
        return None
    seconds = (record or {}).get("chosen", {}).get("measured_s")
    return (float(seconds), int(record.get("nodes") or 1)) if seconds else None


def model_rate(
    prepared, cluster, vocab_size: int, workdir: str | os.PathLike = "."
) -> tuple[float, str] | None:
    """The plan's seconds per iteration, for before the campaign measured any, and what
    it is: with ``layout: auto``, the layout table's predicted s/iteration of the chosen
    layout (hpcllm.training.plan.autolayout: one rate model per plan); else an iteration's
    FLOPs at the user's benchmarked (results/bench/summary.csv) or the cluster's assumed
    TFLOP/s per GPU, as the plan's "Time to train" line. None without a GPU rate."""
    auto = getattr(prepared, "auto", None)
    if auto is not None and auto.search_gpu_hours is not None and auto.chosen.score:
        return float(auto.chosen.score), "the layout table's predicted s/iteration"
    if not (cluster.uses_slurm and cluster.gpus_per_node and cluster.gpu is not None):
        return None
    from hpcllm.plan_cost import measured_tflops
    from hpcllm.training.plan.job_plan import segment_flops

    exp = prepared.experiment
    precision = exp.get("precision", "bf16")
    summary = Path(workdir) / "results" / "bench" / "summary.csv"
    measured_rate = measured_tflops(summary, cluster.name, exp.get("preset"), precision)
    rate = measured_rate[0] if measured_rate else cluster.gpu.rate_tflops(precision)
    flops = segment_flops(prepared, vocab_size) / exp["iterations_per_segment"]
    what = "benchmarked" if measured_rate else "assumed"
    return flops / (prepared.layout.gpus * rate * 1e12), (
        f"the plan's model estimate: FLOPs at the {what} {rate:g} TFLOP/s per GPU"
    )


def _spread(central: float, low: float, high: float, least: float) -> tuple[float, float]:
    """``low``/``high`` widened to at least ``least`` (a share) either side of ``central``."""
    return min(low, central * (1 - least)), max(high, central * (1 + least))


def rate_of(
    segments: Sequence[Measured],
    model_seconds: float | None = None,
    layout: tuple[float, int] | None = None,
    running: Mapping[str, float] | None = None,
    model_source: str = "the plan's model estimate",
) -> Rate | None:
    """The seconds per iteration of the segments left. ``segments``: those a record
    measured; ``running``: :func:`running_times` of the running segment's own iterations
    so far (its speed now rates its own iterations left, and, once it logged
    :data:`RUNNING_MIN_ROWS`, counts as the newest segment's); ``layout``:
    :func:`layout_measurement`, ``model_seconds``: the plan's, both only before anything of
    the campaign measured one. The segments' speeds are weighed newest first
    (:func:`newest_weighted`); the range: slowest to fastest of them, at least
    ±:data:`MEASURED_RATE_SPREAD` (one segment: its 10th and 90th percentile)."""
    rated = [m for m in segments if m.seconds_per_iteration]
    rows = int((running or {}).get("iterations") or 0)
    now = (running or {}).get("recent") or (running or {}).get("seconds_per_iteration")
    if rated:
        speeds = [m.seconds_per_iteration for m in rated]
        with_running = bool(now) and rows >= RUNNING_MIN_ROWS
        if with_running:
            speeds.append(now)
        central = newest_weighted(speeds)
        if len(speeds) == 1:
            low, high = rated[0].p10 or central, rated[0].p90 or central
        else:
            low, high = min(speeds), max(speeds)
        low, high = _spread(central, low, high, MEASURED_RATE_SPREAD)
        n = len(rated)
        source = f"{_rate(central)} s/iteration over {n} segment{'s' * (n != 1)}"
        if with_running:
            source += (
                f" and the running one's newest iterations ({_rate(now)} s), the newest "
                "weighted most"
            )
        elif n > 1:
            source += ", the newest weighted most"
        return Rate(central, low, high, source, current=now if with_running else None)
    if running and running.get("seconds_per_iteration"):
        central = now or running["seconds_per_iteration"]
        low, high = _spread(
            central, running.get("p10") or central, running.get("p90") or central,
            MEASURED_RATE_SPREAD,
        )  # fmt: skip
        return Rate(
            central, low, high,
            f"{_rate(central)} s/iteration over the running segment's first {rows} "
            f"logged iteration{'s' * (rows != 1)}"
            + (" (its newest)" if central != running["seconds_per_iteration"] else ""),
            current=central,
        )  # fmt: skip
    if layout:
        seconds, nodes = layout
        low, high = _spread(seconds, seconds, seconds, LAYOUT_RATE_SPREAD)
        return Rate(
            seconds,
            low,
            high,
            f"{_rate(seconds)} s/iteration measured by layout: auto's measuring job on "
            f"{nodes} node{'s' * (nodes != 1)} (a few iterations: range ±"
            f"{LAYOUT_RATE_SPREAD:.0%}, assumed)",
        )
    if model_seconds:
        low, high = _spread(model_seconds, model_seconds, model_seconds, MODEL_RATE_SPREAD)
        return Rate(
            model_seconds,
            low,
            high,
            f"{_rate(model_seconds)} s/iteration from {model_source} (not measured: range "
            f"±{MODEL_RATE_SPREAD:.0%}, assumed)",
        )
    return None


def overhead_of(
    segments: Sequence[Measured], rate: Rate | None, canary: Sequence[float] = ()
) -> Overhead:
    """``canary``: the seconds of the canary's segments (a few iterations of a tiny model
    each: start-up and save). Measured ones are weighed newest first
    (:func:`newest_weighted`: later segments' start-up and save grew on a loaded machine);
    the range: shortest to longest measured, at least ±:data:`MEASURED_OVERHEAD_SPREAD`;
    assumed values get a wide one."""
    if rate is not None:
        own = [
            max(0.0, m.job_seconds - m.iterations * (m.seconds_per_iteration or rate.seconds))
            for m in segments
            if m.job_seconds is not None
        ]
        if own:
            central = newest_weighted(own)
            low, high = _spread(central, min(own), max(own), MEASURED_OVERHEAD_SPREAD)
            return Overhead(central, "measured", low, high)
    if canary:
        central = statistics.median(canary)
        # a tiny model: a real one loads and saves longer
        return Overhead(central, "the canary's segments", central, 4 * central)
    return Overhead(DEFAULT_OVERHEAD_S, "assumed, not measured", DEFAULT_OVERHEAD_S / 4,
                    DEFAULT_OVERHEAD_S * 4)  # fmt: skip


def wait_of(segments: Sequence[Measured]) -> Wait:
    """The queue wait of each job not yet submitted (or pending without a ``squeue
    --start`` time): the campaign's own measured waits (the running job's included)."""
    waits = [m.wait_seconds for m in segments if m.wait_seconds is not None]
    if waits:
        n = len(waits)
        return Wait(
            statistics.median(waits),
            min(waits),
            max(waits),
            f"measured over {n} job{'s' * (n != 1)}",
            n,
        )
    return Wait(None, None, None, "unknown, not included")


def with_queue(wait: Wait, sample: Mapping[str, float] | None) -> Wait:
    """The wait of jobs after the next: what the partition's queue now would make a job
    wait (``sample``: by side, in seconds) or the measured waits' median, whichever is
    longer (the queue now does not hold the jobs that arrive later, the measured waits
    miss a queue that filled since: on the test cluster both were early, never late);
    the range from both."""
    if sample is None:
        return wait
    if wait.seconds is None:
        return Wait(sample["central"], sample["low"], sample["high"], "from the queue now", 1)
    central = max(wait.seconds, sample["central"])
    return Wait(
        central,
        min(wait.low if wait.low is not None else central, sample["low"]),
        max(wait.high if wait.high is not None else central, sample["high"]),
        f"{wait.source} and the queue now",
    )


def past_errors(records: Sequence[Mapping[str, Any]]) -> list[float]:
    """The campaign's own predictions against the segments that have ended since: per
    prediction a segment's record holds (made at its job's start) and per segment it
    predicted whose record holds its end, ``(actual - predicted) / (actual - made_at)``:
    positive where it ended later than predicted, as a share of the time that was left.
    Time no job of the campaign was queued (a segment's job submitted after the one before
    ended: its controller was stopped) is left out of ``actual``: controller downtime is
    not what the calendar predicts, nor a rate or a queue to correct it by."""
    ends, gaps = {}, {}
    for rec in sorted(records, key=lambda r: r.get("segment", 0)):
        timing = rec.get("timing") or {}
        k, ended = rec.get("segment"), timing.get("ended")
        submitted = (timing.get("job") or {}).get("submitted")
        before = ends.get(k - 1) if isinstance(k, int) else None
        if before is not None and isinstance(submitted, (int, float)):
            gaps[k] = max(0.0, submitted - before)
        if isinstance(ended, (int, float)):
            ends[k] = ended
    out = []
    for rec in records:
        p = (rec.get("timing") or {}).get("prediction")
        j = rec.get("segment")
        if not isinstance(p, Mapping) or not isinstance(j, int):
            continue
        predicted = p.get("segment_ends") or [p.get("segment_end")]
        for i, pred in enumerate(predicted):
            actual = ends.get(j + i)
            if actual is None or pred is None:
                continue
            actual -= sum(gaps.get(m, 0.0) for m in range(j + 1, j + i + 1))
            if actual - p["made_at"] > 0:
                out.append((actual - pred) / (actual - p["made_at"]))
    return out


def _conformal(values: Sequence[float], share: float) -> float:
    """The value at least ``share`` of ``values`` (and of the next one, as in split
    conformal prediction) lie at or below: with few values, the largest."""
    ordered = sorted(values)
    return ordered[min(len(ordered), math.ceil((len(ordered) + 1) * share)) - 1]


def calibrate(f: Forecast, errors: Sequence[float]) -> Forecast:
    """``f`` against the campaign's own past errors (:func:`past_errors`): the interval is
    widened where they were larger: each side reaches at least the late (high) and early
    (low) errors' :data:`CALIBRATION_TAIL` quantile, times the time left, so that the
    interval holds :data:`INTERVAL` of them. Said so in the line. The date stays the
    model's: moving it by the errors' median (until 28 November 2026) moved it by the
    waits and speeds of a few earlier segments, which the model now follows itself, and
    put it 23 % of the time left late in the benchmark's run 9."""
    if not errors:
        return f
    left = max(0.0, f.finish - f.now)
    late = _conformal([max(0.0, e) for e in errors], CALIBRATION_TAIL)
    early = _conformal([max(0.0, -e) for e in errors], CALIBRATION_TAIL)
    high = max(f.high, f.finish + late * left)
    low = max(f.now, min(f.low, f.finish - early * left))
    n = len(errors)
    compared = f"{n} earlier prediction{'s' * (n != 1)} of segment ends"
    if high > f.high + 0.5 or low < f.low - 0.5:
        widened = (
            f"interval widened to their spread (up to {late:.0%} late, {early:.0%} early of "
            "the time left)"
        )
    else:
        widened = "interval holds their spread"
    note = f"{widened}: this campaign's own errors ({compared})"
    return replace(f, low=low, high=high, calibration=note)


# ---- the forecast


@dataclass(frozen=True)
class _Bound:
    spi: float  # the later segments'
    spi_now: float  # the running segment's, for its iterations left
    overhead: float
    wait: float | None
    side: str  # the waits' (queue, squeue --start): "low", "central", "high"


_PARTS = ("rate", "overhead", "wait")


def _sides(rate: Rate, overhead: Overhead, wait: Wait, sides: Mapping[str, str]) -> _Bound:
    """Each part at its side (``sides``: by part, "central" where not named)."""
    r, o, w = (sides.get(p, "central") for p in _PARTS)
    current = rate.current or rate.seconds
    spi = {"low": rate.low, "central": rate.seconds, "high": rate.high}[r]
    return _Bound(
        spi=spi,
        spi_now=current * spi / rate.seconds,  # the same share off as the later segments'
        overhead={"low": overhead.low, "central": overhead.seconds, "high": overhead.high}[o],
        wait={"low": wait.low, "central": wait.seconds, "high": wait.high}[w],
        side=w,
    )


def forecast(
    now: float,
    segments_left: Sequence[int],
    rate: Rate,
    overhead: Overhead,
    wait: Wait,
    running_since: float | None = None,
    running_left: int | None = None,
    expected_starts: Sequence[float | None] = (),
    waiting_since: float | None = None,
    running_iterations: int | None = None,
    next_start: Callable[[float], Mapping[str, float] | None] | None = None,
    queue: str | None = None,
    running_trained_s: float | None = None,
) -> Forecast:
    """Lay out the segments left (their iterations each, in order) from ``now``.

    ``running_since``: the first of them is being trained by a job that started then, for
    ``running_iterations`` iterations in all (default: the segment's left); ``running_left``:
    the iterations it has still to train (its log's newest line; None: all);
    ``running_trained_s``: how long the iterations it logged took. With both, it ends its
    iterations left at ``rate.current`` after its newest line, then the start-up and save
    its start-up so far has not used; else at its start plus start-up and save plus all
    its iterations.
    ``expected_starts``: per job still to start, in order, the start ``squeue --start``
    gives it (None where it gives none): the high end of that job's start (it counts other
    jobs' whole time limits; they end before them), starting at once the low one.
    ``next_start``: when the first job still to start starts, by side, if it can start at
    the time given (queue_state.start_range: the partition's queue now): its central and
    low, its high where squeue --start gives none (then no earlier than the measured
    wait); without it a job with a squeue time starts in the middle of that and its
    predecessor's end. Every other job waits the measured wait (its own: never another
    job's squeue time), counted for the first of them from ``waiting_since`` (when it
    could start: its predecessor's end, or its submission), so that a forecast moves only
    when something but the clock does. ``queue``: what that queue held, for the line.

    The interval is sized per part (:data:`_PARTS`): each moved alone to its low and high
    end, the others central, and the moves added as independent errors (root of the sum
    of squares): every part at its extreme at once is far less likely than 80 %.
    """
    starts = list(expected_starts)
    from_queue: dict[str, float] = {}  # the next job's wait from the queue, by side
    split = running_left is not None and running_trained_s is not None

    def lay_out(b: _Bound, record: bool = True) -> list[float]:
        t, ends, job = now, [], 0
        for i, iterations in enumerate(segments_left):
            if i == 0 and running_since is not None:
                if split:
                    # its start-up so far (and the time since its newest line): the rest of
                    # a segment's start-up and save is its save
                    seen = max(0.0, now - running_since - running_trained_s)
                    end = now + running_left * b.spi_now + max(0.0, b.overhead - seen)
                else:
                    total = iterations if running_iterations is None else running_iterations
                    end = running_since + b.overhead + total * b.spi_now
                    if running_left is not None:  # never before its iterations left can run
                        end = max(end, now + running_left * b.spi_now)
            else:
                expected = starts[job] if job < len(starts) else None
                since = waiting_since if (job == 0 and waiting_since is not None) else t
                job += 1
                q = next_start(since) if job == 1 and next_start is not None else None
                if q:
                    # the queue now: other jobs' limits and sizes (high), ending early
                    start = max(t, q[b.side])
                    if b.side == "high" and expected is not None:
                        start = max(t, expected)  # the scheduler's own, at their limits
                    elif b.side == "high" and b.wait is not None:
                        # jobs not in the queue yet: the measured waits count them
                        start = max(start, since + b.wait)
                    if expected is not None:
                        start = min(start, max(t, expected))
                    if record:
                        from_queue[b.side] = start - max(since, now)
                elif expected is not None:
                    # squeue --start counts other jobs' whole time limits: the high end;
                    # starting at once the low one, the middle of the two the central
                    # (from when it could start: the middle stays put as the clock moves)
                    middle = since + max(0.0, expected - since) / 2
                    start = {"low": t, "central": max(t, middle), "high": max(t, expected)}[b.side]
                elif b.wait is not None:
                    start = max(t, since + b.wait)
                else:
                    start = t
                end = start + b.overhead + iterations * b.spi
            end = max(end, now)
            ends.append(end)
            t = end
        return ends

    central = lay_out(_sides(rate, overhead, wait, {}))
    last = central[-1] if central else now
    moves: dict[str, list[float]] = {"low": [], "high": []}
    for side in moves:
        for part in _PARTS:
            ends = lay_out(_sides(rate, overhead, wait, {part: side}), record=part == "wait")
            if ends:
                moves[side].append(ends[-1] - last)
    low = last - math.sqrt(sum(min(0.0, m) ** 2 for m in moves["low"] + moves["high"]))
    high = last + math.sqrt(sum(max(0.0, m) ** 2 for m in moves["low"] + moves["high"]))
    running = running_since is not None and bool(segments_left)
    jobs_left = len(segments_left) - (1 if running else 0)
    return Forecast(
        now=now,
        finish=last,
        low=max(now, low),
        high=high,
        segment_ends=tuple(central),
        rate=rate,
        overhead=overhead,
        wait=wait,
        jobs_left=jobs_left,
        segments_left=len(segments_left),
        squeue_starts=sum(1 for s in starts[:jobs_left] if s is not None),
        running=running,
        queue_wait=(
            tuple(from_queue[k] for k in ("central", "low", "high"))  # type: ignore[arg-type]
            if len(from_queue) == 3
            else None
        ),
        queue=queue if len(from_queue) == 3 else None,
    )


def segments_left(experiment: Mapping[str, Any], iteration: int) -> list[int]:
    """The iterations each segment still to train has left, from checkpoint ``iteration``."""
    per = experiment["iterations_per_segment"]
    return [
        min(per, k * per - iteration)
        for k in range(1, experiment["segments"] + 1)
        if k * per > iteration
    ]


# ---- describing


def _rate(seconds: float) -> str:
    return f"{seconds:.3g}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _ordinal(day: int) -> str:
    suffix = "th" if 10 <= day % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


def when(t: float, fine: bool = False) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S" if fine else "%Y-%m-%d %H:%M", time.localtime(t))


def _bound(t: float, central: float, fine: bool) -> str:
    clock = time.strftime("%H:%M:%S" if fine else "%H:%M", time.localtime(t))
    if time.localtime(t)[:3] == time.localtime(central)[:3]:
        return clock
    return f"{_ordinal(time.localtime(t).tm_mday)} {clock}"


def describe(f: Forecast) -> str:
    """``expected to finish: 2026-11-29 14:00 CET (80 % interval: 28th 22:00 to 30th 03:00),
    from: 2.41 s/iteration over 3 segments, 4 segments and 4 jobs left, start-up and save
    6 min per segment (measured), queue wait 1.2 h each (measured over 3 jobs)``; seconds
    shown where the whole campaign left is under an hour. The interval is always printed."""
    fine = f.high - f.now < 3600
    zone = time.strftime("%Z", time.localtime(f.finish))
    between = (
        f" ({INTERVAL * 100:.0f} % interval: {_bound(f.low, f.finish, fine)} to "
        f"{_bound(f.high, f.finish, fine)})"
    )
    jobs = f"{f.jobs_left} job{'s' * (f.jobs_left != 1)} left"
    if f.wait.seconds is not None:
        each = f"{_duration(f.wait.seconds)} each ({f.wait.source})"
    else:
        each = "unknown, not included"
    if f.jobs_left == 0:
        wait = "no job left to start"
    elif f.queue_wait is not None:
        central, low, high = f.queue_wait
        wait = (
            f"queue: the next job waits {_duration(central)} ({_duration(low)} to "
            f"{_duration(high)}) by {f.queue}"
        )
        if f.squeue_starts:
            wait += " (the high end: squeue --start's time)"
        if f.jobs_left > 1:
            wait += f", the others {each}"
    elif f.squeue_starts:
        # squeue --start counts other jobs' time limits: late where they end before them
        named = "the next job" if f.squeue_starts == 1 else f"{f.squeue_starts} jobs"
        wait = (
            f"queue: {named} at squeue --start's time (the interval reaches back to starting "
            "at once: it counts other jobs' time limits)"
        )
        if f.jobs_left > f.squeue_starts:
            wait += f", the others {each}"
    else:
        wait = f"queue wait {each}"
    return (
        f"expected to finish: {when(f.finish, fine)} {zone}{between}, from: {f.rate.source}, "
        f"{f.segments_left} segment{'s' * (f.segments_left != 1)} and {jobs}, start-up and "
        f"save {_duration(f.overhead.seconds)} per segment ({f.overhead.source}), {wait}"
        + (f"; {f.calibration}" if f.calibration else "")
    )


# ---- where the records are


def read_records(folders: Sequence[str | os.PathLike], segments: int) -> list[dict]:
    """Segment records seg1..seg<segments> (the first folder that has one wins)."""
    out = []
    for k in range(1, segments + 1):
        for folder in folders:
            try:
                rec = json.loads((Path(folder) / f"seg{k}.json").read_text())
            except (OSError, ValueError):
                continue
            if isinstance(rec, dict):
                out.append(rec)
                break
    return out


def canary_seconds(path: str | os.PathLike | None) -> list[float]:
    """The seconds of the training canary's segments (its record), [] without one."""
    try:
        rec = json.loads(Path(path).read_text()) if path else {}
    except (OSError, ValueError):
        return []
    return [s["seconds"] for s in rec.get("segments", []) if isinstance(s.get("seconds"), float)]


# ---- in the segment's job

# Each Slurm command a segment's job asks at its start (squeue of the partition, sinfo,
# squeue of this user's jobs, squeue --start): they answer within a second or two; a
# controller that does not answer costs the segment at most this, and the prediction
# falls back to the measured waits.
IN_JOB_TIMEOUT_S = 10


def queue_unread_note(f: Forecast, why: str | None) -> str:
    """What the line adds where the partition's queue was not read (``why``) and a job
    still to start has no ``squeue --start`` time: "" where nothing is missing."""
    if not why or f.jobs_left <= f.squeue_starts:
        return ""
    return f"; the partition's queue not read ({why}): measured waits only"


def segment_start(
    experiment: Mapping[str, Any],
    segment: int,
    start_iteration: int,
    records_folders: Sequence[str | os.PathLike],
    save: str | os.PathLike,
    job_id: str | None,
    job_times: Mapping[str, float | None],
    now: float | None = None,
    layout: tuple[float, int] | None = None,
    queue: QueueState | None = None,
    mine: Sequence[str] = (),
    expected_starts: Sequence[float | None] = (),
    queue_unread: str | None = None,
) -> dict[str, Any]:
    """The ``timing`` of a segment's record at its start: its job's Slurm times and the
    prediction it makes (this segment's end and the campaign's), also appended to the
    checkpoint folder's predictions.jsonl (history: never rewritten).

    The prediction is status's (:func:`campaign_forecast`), with this job as the running
    one: ``queue`` the partition's jobs now (queue_state.read; None: not read, and
    ``queue_unread`` says why in the line), ``mine`` this campaign's job ids in it,
    ``expected_starts`` ``squeue --start``'s time of each of its pending jobs, in order."""
    now = time.time() if now is None else now
    job = {"id": job_id, **job_times}
    timing: dict[str, Any] = {"job": job, "training_started": now}
    records = read_records(records_folders, segment - 1)
    f = campaign_forecast(
        experiment,
        records,
        start_iteration,
        now,
        layout=layout,
        running_since=job.get("started") or now,
        expected_starts=expected_starts,
        running_segment=segment,
        running_start_iteration=start_iteration,
        # its own wait counts among the measured ones (its record is not written yet)
        running_job=job,
        queue=queue,
        mine=mine,
        nodes=int((experiment.get("layout") or {}).get("nodes") or 1),
    )
    if f is None:
        timing["prediction"] = None  # nothing measured yet: the first segment measures
        return timing
    prediction = {
        "made_at": now,
        "segment_end": f.segment_ends[0],
        # every segment's predicted end from this one on: later jobs' errors against them
        "segment_ends": list(f.segment_ends),
        "campaign_end": f.finish,
        "campaign_low": f.low,
        "campaign_high": f.high,
        "rate": asdict(f.rate),
        "overhead": asdict(f.overhead),
        "wait": asdict(f.wait),
        "line": describe(f) + queue_unread_note(f, queue_unread if queue is None else None),
    }
    timing["prediction"] = prediction
    folder = Path(save) / "chain"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / PREDICTIONS, "a") as out:
        out.write(json.dumps({"segment": segment, "job": job_id, **prediction}) + "\n")
    return timing


@dataclass(frozen=True)
class JobQueue:
    """What a segment's job read of its partition's queue at its start
    (:func:`read_job_queue`): :func:`segment_start`'s queue arguments."""

    queue: QueueState | None
    mine: tuple[str, ...] = ()
    expected_starts: tuple[float | None, ...] = ()
    queue_unread: str | None = None


def read_job_queue(
    job_id: str,
    chain_name: str | None,
    now: float,
    environ: Mapping[str, str] = os.environ,
    timeout: float = IN_JOB_TIMEOUT_S,
) -> JobQueue:
    """The partition's queue as status reads it, from inside job ``job_id``: its partition
    (``SLURM_JOB_PARTITION``; queue_state.read: one squeue, one sinfo), the chain's jobs
    (named ``chain_name``, hpcllm.training.campaign.chain: one squeue of this user's jobs)
    and its pending ones' ``squeue --start`` times (one call, where one is pending). Where
    Slurm cannot be asked from the node (some sites forbid it), the queue is None and
    ``queue_unread`` says why."""
    from hpcllm.training.campaign import queue_state, queue_times

    partition = environ.get("SLURM_JOB_PARTITION")
    if not partition:
        return JobQueue(None, (job_id,), queue_unread="the job's partition is not known")
    queue = queue_state.read(partition, now, timeout)
    if queue is None:
        why = f"squeue or sinfo -p {partition} could not be asked from the job's node"
        return JobQueue(None, (job_id,), queue_unread=why)
    chain = []
    if chain_name:
        from hpcllm.training.campaign.chain_listing import ChainError, live_jobs, squeue_listing

        try:
            listing = squeue_listing(timeout)
            chain = [j for j in live_jobs(listing, chain_name) if j["id"] != job_id]
        except ChainError as e:
            log.warning("the chain's jobs not read (%s): the queue without them", e)
    pending = [j["id"] for j in chain if j["state"] == "PENDING"]
    starts = queue_times.expected_starts(timeout) if pending else {}
    return JobQueue(
        queue,
        (job_id, *(j["id"] for j in chain)),
        tuple(starts.get(j) for j in pending),
    )


def segment_end(timing: dict[str, Any], rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``timing`` completed at the segment's end: when, and its iterations' times."""
    return {**timing, **(iteration_times(rows) or {}), "ended": time.time()}


def job_timing(
    experiment, segment: int, start_iteration: int, paths, name: str | None = None
) -> dict[str, Any] | None:
    """:func:`segment_start` for a segment job with ``paths`` (hpcllm.training.plan
    .experiment.Paths), asking Slurm about the job itself and its partition's queue
    (:func:`read_job_queue`; the chain's jobs of experiment ``name``, run from the working
    directory); None where that fails: the calendar never stops training."""
    from hpcllm.training.campaign import queue_times, records
    from hpcllm.training.campaign.chain_listing import job_name_of

    job_id = os.environ.get("SLURM_JOB_ID")
    try:
        now = time.time()
        # the queue as status reads it (outside Slurm: none, and nothing to say of it)
        seen = (
            read_job_queue(job_id, job_name_of(Path.cwd(), name) if name else None, now)
            if job_id
            else JobQueue(None)
        )
        return segment_start(
            experiment,
            segment,
            start_iteration,
            [records.kept_path(paths.save, 1).parent, Path(paths.record).parent],
            paths.save,
            job_id,
            queue_times.job_times(job_id),
            now=now,
            # before any segment ran: what layout: auto's measuring job timed, if it ran
            layout=layout_measurement(name) if name else None,
            queue=seen.queue,
            mine=seen.mine,
            expected_starts=seen.expected_starts,
            queue_unread=seen.queue_unread,
        )
    except Exception as e:  # noqa: BLE001  (a prediction is worth less than the segment)
        log.warning("segment %d: no prediction of its finish (%s: %s)", segment,
                    type(e).__name__, e)  # fmt: skip
        return None


def job_timing_end(
    timing: dict[str, Any] | None, engine_log: str | os.PathLike, offset: int, stop: int
) -> dict[str, Any]:
    """``{"timing": ...}`` for the record: :func:`segment_end` from this job's part of the
    engine log (from byte ``offset``); {} without a timing."""
    if timing is None:
        return {}
    from hpcllm.training.engines.log_lines import log_text_from, parse_log_lines

    text = log_text_from(engine_log, offset) or ""
    rows = [r for r in parse_log_lines(text) if r["iteration"] <= stop]
    return {"timing": segment_end(timing, rows)}


# ---- for status and the plan


def campaign_forecast(
    experiment: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    iteration: int,
    now: float,
    model_seconds: float | None = None,
    canary: Sequence[float] = (),
    layout: tuple[float, int] | None = None,
    running_since: float | None = None,
    running_logged: int | None = None,
    expected_starts: Sequence[float | None] = (),
    running_segment: int | None = None,
    running_start_iteration: int | None = None,
    running_job: Mapping[str, float | None] | None = None,
    running_rate: Mapping[str, float] | None = None,
    pending_since: float | None = None,
    model_source: str = "the plan's model estimate",
    queue: QueueState | None = None,
    mine: Sequence[str] = (),
    nodes: int = 1,
) -> Forecast | None:
    """The campaign's forecast from checkpoint ``iteration`` (None: nothing to rate it
    with, or nothing left).

    A running job (started at ``running_since``) is counted by its own progress: segment
    ``running_segment`` (default: the first the checkpoint has not reached), from
    ``running_start_iteration`` to its target, ``running_logged`` the newest iteration it
    logged; between its last checkpoint and its end it is still that segment's job, never
    the next one. ``running_job``: its Slurm times (:func:`queue_times.job_times`): its wait
    counts among the measured ones. ``running_rate``: :func:`running_times` of its
    iterations so far (the rate before any record measured one). ``expected_starts``:
    ``squeue --start``'s time per pending job, in order; ``pending_since``: when the first
    pending job was submitted (its wait counts from then or from the last segment's end).
    ``queue``: the partition's jobs now (queue_state.read), ``mine`` this campaign's job
    ids in it, ``nodes`` a segment job's: the next job's start from it, and the later
    jobs' waits widened by it (None: the measured waits alone). The interval is widened
    by the campaign's own past errors (:func:`calibrate`)."""
    per, segments = experiment["iterations_per_segment"], experiment["segments"]
    left = segments_left(experiment, iteration)
    running_left = running_total = None
    history = measured(records)
    waiting_since = None
    if running_since is not None:
        k = running_segment or next(
            (j for j in range(1, segments + 1) if j * per > iteration), None
        )
        if k is None:
            running_since = None
        else:
            start = (k - 1) * per if running_start_iteration is None else running_start_iteration
            # its progress where it shows one: its log's newest line, a checkpoint it saved
            shown = [i for i in (running_logged, iteration) if i is not None and i > start]
            done = max([start, *shown])
            running_left = max(0, k * per - done) if shown else None
            running_total = max(0, k * per - start)
            later = [min(per, j * per - iteration) for j in range(k + 1, segments + 1)]
            left = [k * per - done, *(n for n in later if n > 0)]
            if running_job and running_job.get("started"):
                # Slurm's start, as a measured start-up and save counts from it (its
                # attempt starts later, after the launch)
                running_since = running_job["started"]
            if running_job:
                # its own wait counts among the measured ones (its record is not written yet)
                others = [r for r in records if r.get("segment", 0) < k]
                history = measured([*others, {"segment": k, "timing": {"job": running_job}}])
    else:
        ended = [m.ended for m in history if m.ended is not None]
        since = [t for t in (max(ended) if ended else None, pending_since) if t is not None]
        waiting_since = max(since) if since else None
    rate = rate_of(history, model_seconds, layout, running_rate, model_source)
    if not left or rate is None:
        return None
    overhead = overhead_of(history, rate, canary)
    trained_s = None  # how long the running job's logged iterations took
    if running_since is not None and running_left is not None:
        # the mean of its rows: their sum is the time they took (the median is not)
        logged = running_rate or {}  # {}: nothing logged
        own = logged.get("mean") or logged.get("seconds_per_iteration")
        trained_s = (running_total - running_left) * own if own else None
    if overhead.source != "measured" and running_since is not None and running_left is not None:
        # the running job's own start-up: its time before the iterations it logged (at
        # most: the time since its newest line counts too); its save assumed as long
        trained = running_total - running_left
        seen = now - running_since - (trained * rate.seconds if trained_s is None else trained_s)
        if trained > 0 and seen > 0:
            overhead = Overhead(
                2 * seen, "start-up measured by the running job, save assumed as long",
                seen, 3 * seen,
            )  # fmt: skip
    wait, next_start, queue_note = wait_of(history), None, None
    if queue is not None:
        from hpcllm.training.campaign import queue_state

        def next_start(eligible_at: float) -> dict[str, float] | None:
            return queue_state.start_range(queue, mine, nodes, eligible_at)

        now_start = next_start(now)
        if now_start is not None:
            wait = with_queue(wait, {k: v - now for k, v in now_start.items()})
        queue_note = queue_state.describe(queue, mine)
    f = forecast(
        now,
        left,
        rate,
        overhead,
        wait,
        running_since=running_since,
        running_left=running_left,
        expected_starts=list(expected_starts),
        waiting_since=waiting_since,
        running_iterations=running_total,
        next_start=next_start,
        queue=queue_note,
        running_trained_s=trained_s,
    )
    return calibrate(f, past_errors(records))


# ---- for the results page


def prediction_rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per segment whose record holds a prediction: the segment's and the campaign's
    predicted end against what happened (seconds of error: predicted - actual, positive
    when it finished earlier than predicted). The campaign's actual end: the last
    segment's, once it is recorded."""
    ordered = sorted(records, key=lambda r: r.get("segment", 0))
    last = ordered[-1] if ordered else {}
    campaign_end = None
    if last.get("segment") == last.get("segments"):
        campaign_end = (last.get("timing") or {}).get("ended")
    rows = []
    for rec in ordered:
        timing = rec.get("timing") or {}
        p = timing.get("prediction")
        if not p:
            continue
        ended = timing.get("ended")
        rows.append(
            {
                "segment": rec.get("segment"),
                "made_at": p["made_at"],
                "segment_predicted": p["segment_end"],
                "segment_actual": ended,
                "segment_error_s": p["segment_end"] - ended if ended else None,
                "campaign_predicted": p["campaign_end"],
                "campaign_low": p.get("campaign_low"),
                "campaign_high": p.get("campaign_high"),
                "campaign_actual": campaign_end,
                "campaign_error_s": p["campaign_end"] - campaign_end if campaign_end else None,
                "basis": p.get("line", ""),
            }
        )
    return rows
