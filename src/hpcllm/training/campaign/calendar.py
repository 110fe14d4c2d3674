"""When a training campaign will finish: a date with a range, and how earlier predictions fared.

The finish is laid out segment by segment from four measured things:

- seconds per iteration: the campaign's own segments once any ran (the median of each
  segment's logged iteration times; the range: its slowest and fastest segment, or with
  one segment the 10th and 90th percentile of its iterations), else what ``layout: auto``'s
  measuring job timed for the layout it chose (the model at full size on the site, a few
  iterations: no range), else the plan's model estimate (FLOPs per iteration at the
  assumed or benchmarked TFLOP/s; no range);
- each segment's start-up and save: its job's time from Slurm's start to the record,
  less its iterations at its rate (median over segments), else the canary's segments
  (a tiny model: a real one loads and saves longer), else :data:`DEFAULT_OVERHEAD_S`;
- the queue wait of each job still to start: ``squeue --start`` for a pending job the
  scheduler gave a start time, else this campaign's own waits so far (median; range:
  shortest and longest), else unknown: not included, and said so;
- the iterations left, one job per segment.

Each segment's job writes the prediction it makes at its start into its record
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
import os
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Start-up and save of a segment where nothing measured them: an assumption, said so.
DEFAULT_OVERHEAD_S = 300.0
# A job submitted this long after the previous segment ended belongs to a new run (the
# campaign was stopped): its wait counts from its submission, not from that end.
NEW_RUN_GAP_S = 600.0
PREDICTIONS = "predictions.jsonl"


@dataclass(frozen=True)
class Rate:
    seconds: float  # per iteration
    low: float
    high: float
    source: str  # e.g. "2.41 s/iteration over 3 segments"


@dataclass(frozen=True)
class Overhead:
    seconds: float  # per segment: start-up and save
    source: str


@dataclass(frozen=True)
class Wait:
    seconds: float | None  # per job still to start; None: unknown
    low: float | None
    high: float | None
    source: str


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
    segment_ends: tuple[float, ...]  # the central end of each segment left, in order
    rate: Rate
    overhead: Overhead
    wait: Wait
    jobs_left: int  # jobs still to start
    segments_left: int


# ---- measuring (in the segment's job)


def iteration_times(rows: Iterable[Mapping[str, Any]]) -> dict[str, float] | None:
    """Median, 10th and 90th percentile of the seconds per iteration of engine log lines."""
    values = sorted(
        r["elapsed time per iteration (ms)"] / 1000
        for r in rows
        if isinstance(r.get("elapsed time per iteration (ms)"), float)
        and r["elapsed time per iteration (ms)"] > 0
    )
    if not values:
        return None

    def share(q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))]

    return {
        "seconds_per_iteration": round(statistics.median(values), 6),
        "p10": round(share(0.1), 6),
        "p90": round(share(0.9), 6),
    }


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
            since = job.get("eligible") or job.get("submitted")
            if previous_end is not None and (since is None or since < previous_end + NEW_RUN_GAP_S):
                since = previous_end
            if since is not None:
                wait = max(0.0, job["started"] - since)
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


def rate_of(
    segments: Sequence[Measured],
    model_seconds: float | None = None,
    layout: tuple[float, int] | None = None,
) -> Rate | None:
    """``layout``: :func:`layout_measurement`, used before any segment ran."""
    rated = [m for m in segments if m.seconds_per_iteration]
    if rated:
        central = statistics.median(m.seconds_per_iteration for m in rated)
        if len(rated) == 1:
            low, high = rated[0].p10 or central, rated[0].p90 or central
        else:
            low = min(m.seconds_per_iteration for m in rated)
            high = max(m.seconds_per_iteration for m in rated)
        n = len(rated)
        return Rate(
            central,
            min(low, central),
            max(high, central),
            f"{_rate(central)} s/iteration over {n} segment{'s' * (n != 1)}",
        )
    if layout:
        seconds, nodes = layout
        return Rate(
            seconds,
            seconds,
            seconds,
            f"{_rate(seconds)} s/iteration measured by layout: auto's measuring job on "
            f"{nodes} node{'s' * (nodes != 1)} (a few iterations: no range from it)",
        )
    if model_seconds:
        return Rate(
            model_seconds,
            model_seconds,
            model_seconds,
            f"{_rate(model_seconds)} s/iteration from the plan's model estimate (not "
            "measured: no range from it)",
        )
    return None


def overhead_of(
    segments: Sequence[Measured], rate: Rate | None, canary: Sequence[float] = ()
) -> Overhead:
    """``canary``: the seconds of the canary's segments (a few iterations of a tiny model
    each: start-up and save)."""
    if rate is not None:
        own = [
            max(0.0, m.job_seconds - m.iterations * (m.seconds_per_iteration or rate.seconds))
            for m in segments
            if m.job_seconds is not None
        ]
        if own:
            return Overhead(statistics.median(own), "measured")
    if canary:
        return Overhead(statistics.median(canary), "the canary's segments")
    return Overhead(DEFAULT_OVERHEAD_S, "assumed, not measured")


def wait_of(segments: Sequence[Measured], expected: Sequence[float | None] = ()) -> Wait:
    """The queue wait of each job still to start. ``expected``: the waits ``squeue
    --start`` gives for the pending jobs (None where it gives no time)."""
    known = [w for w in expected if w is not None]
    waits = [m.wait_seconds for m in segments if m.wait_seconds is not None]
    if known:
        both = known + waits
        return Wait(statistics.median(known), min(both), max(both), "squeue --start")
    if waits:
        n = len(waits)
        return Wait(
            statistics.median(waits),
            min(waits),
            max(waits),
            f"measured over {n} job{'s' * (n != 1)}",
        )
    return Wait(None, None, None, "unknown, not included")


# ---- the forecast


def forecast(
    now: float,
    segments_left: Sequence[int],
    rate: Rate,
    overhead: Overhead,
    wait: Wait,
    running_since: float | None = None,
    running_left: int | None = None,
    expected_starts: Sequence[float | None] = (),
) -> Forecast:
    """Lay out the segments left (their iterations each, in order) from ``now``.

    ``running_since``: the first of them is being trained by a job that started then;
    ``running_left``: the iterations it has still to train (its log's newest line; None:
    all). ``expected_starts``: the start time ``squeue --start`` gives the jobs still to
    start, in order (None where it gives none): a job starts at the later of that time
    and its predecessor's end.
    """

    def lay_out(spi: float, wait_s: float) -> list[float]:
        t, ends = now, []
        pending = iter(expected_starts)
        for i, iterations in enumerate(segments_left):
            if i == 0 and running_since is not None:
                end = running_since + overhead.seconds + iterations * spi
                if running_left is not None:  # never before its iterations left can run
                    end = max(end, now + running_left * spi)
                end = max(end, now)
            else:
                start = t + wait_s
                expected = next(pending, None)
                if expected is not None:
                    start = max(t, expected)
                end = start + overhead.seconds + iterations * spi
            ends.append(end)
            t = end
        return ends

    central = lay_out(rate.seconds, wait.seconds or 0.0)
    low = lay_out(rate.low, wait.low or 0.0)
    high = lay_out(rate.high, wait.high or 0.0)
    jobs_left = len(segments_left) - (1 if running_since is not None and segments_left else 0)
    last = central[-1] if central else now
    return Forecast(
        now=now,
        finish=last,
        low=low[-1] if low else now,
        high=high[-1] if high else now,
        segment_ends=tuple(central),
        rate=rate,
        overhead=overhead,
        wait=wait,
        jobs_left=jobs_left,
        segments_left=len(segments_left),
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
    """``expected to finish: 2026-11-29 14:00 (between 28th 22:00 and 30th 03:00), from:
    2.41 s/iteration over 3 segments, 4 jobs left, queue wait 1.2 h each (squeue
    --start)``; seconds shown where the whole campaign left is under an hour."""
    fine = f.high - f.now < 3600
    zone = time.strftime("%Z", time.localtime(f.finish))
    between = (
        f" (between {_bound(f.low, f.finish, fine)} and {_bound(f.high, f.finish, fine)})"
        if f.high - f.low >= 1
        else ""
    )
    jobs = f"{f.jobs_left} job{'s' * (f.jobs_left != 1)} left"
    wait = (
        f"queue wait {_duration(f.wait.seconds)} each ({f.wait.source})"
        if f.wait.seconds is not None
        else "queue wait unknown, not included"
    )
    return (
        f"expected to finish: {when(f.finish, fine)} {zone}{between}, from: {f.rate.source}, "
        f"{f.segments_left} segment{'s' * (f.segments_left != 1)} and {jobs}, start-up and "
        f"save {_duration(f.overhead.seconds)} per segment ({f.overhead.source}), {wait}"
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
) -> dict[str, Any]:
    """The ``timing`` of a segment's record at its start: its job's Slurm times and the
    prediction it makes (this segment's end and the campaign's), also appended to the
    checkpoint folder's predictions.jsonl (history: never rewritten)."""
    now = time.time() if now is None else now
    job = {"id": job_id, **job_times}
    timing: dict[str, Any] = {"job": job, "training_started": now}
    # this job's own wait counts among the measured ones (its record is not written yet)
    this = {"segment": segment, "timing": {"job": job}}
    history = measured([*read_records(records_folders, segment - 1), this])
    rate = rate_of(history, layout=layout)
    if rate is None:
        timing["prediction"] = None  # nothing measured yet: the first segment measures
        return timing
    f = forecast(
        now,
        segments_left(experiment, start_iteration),
        rate,
        overhead_of(history, rate),
        wait_of(history),
        running_since=job.get("started") or now,
    )
    prediction = {
        "made_at": now,
        "segment_end": f.segment_ends[0],
        "campaign_end": f.finish,
        "campaign_low": f.low,
        "campaign_high": f.high,
        "rate": asdict(f.rate),
        "overhead": asdict(f.overhead),
        "wait": asdict(f.wait),
        "line": describe(f),
    }
    timing["prediction"] = prediction
    folder = Path(save) / "chain"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / PREDICTIONS, "a") as out:
        out.write(json.dumps({"segment": segment, "job": job_id, **prediction}) + "\n")
    return timing


def segment_end(timing: dict[str, Any], rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``timing`` completed at the segment's end: when, and its iterations' times."""
    return {**timing, **(iteration_times(rows) or {}), "ended": time.time()}


def job_timing(
    experiment, segment: int, start_iteration: int, paths, name: str | None = None
) -> dict[str, Any] | None:
    """:func:`segment_start` for a segment job with ``paths`` (hpcllm.training.plan
    .experiment.Paths), asking Slurm about the job itself; None where that fails: the
    calendar never stops training."""
    from hpcllm.training.campaign import queue_times, records

    job_id = os.environ.get("SLURM_JOB_ID")
    try:
        return segment_start(
            experiment,
            segment,
            start_iteration,
            [records.kept_path(paths.save, 1).parent, Path(paths.record).parent],
            paths.save,
            job_id,
            queue_times.job_times(job_id),
            # before any segment ran: what layout: auto's measuring job timed, if it ran
            layout=layout_measurement(name) if name else None,
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
    from hpcllm.training.engines.log_lines import parse_log_lines

    try:
        with open(engine_log, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        text = ""
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
) -> Forecast | None:
    """The campaign's forecast from checkpoint ``iteration`` (None: nothing to rate it
    with, or nothing left). ``running_logged``: the newest iteration the running job
    logged."""
    left = segments_left(experiment, iteration)
    history = measured(records)
    rate = rate_of(history, model_seconds, layout)
    if not left or rate is None:
        return None
    running_left = None
    if running_since is not None and running_logged is not None:
        stop = iteration + left[0]
        running_left = max(0, stop - max(running_logged, iteration))
    pending = list(expected_starts)
    return forecast(
        now,
        left,
        rate,
        overhead_of(history, rate, canary),
        wait_of(history, [max(0.0, s - now) if s is not None else None for s in pending]),
        running_since=running_since,
        running_left=running_left,
        expected_starts=pending,
    )


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
