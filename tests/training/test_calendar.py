"""The campaign's calendar (hpcllm.training.campaign.calendar): the finish laid out from
measured rates, start-up and save, queue waits; Slurm's times read from its own output."""

from __future__ import annotations

import json
import math
import time
from datetime import datetime

import pytest
from training_helpers import segment_record

from hpcllm.training.campaign import calendar, queue_times

T0 = datetime(2026, 11, 20, 12, 0, 0).timestamp()
EXP = {"segments": 4, "iterations_per_segment": 100}


record = segment_record  # segment k of EXP as its job records it


def test_slurm_times_are_read_from_scontrol_and_squeue_start_output():
    line = (
        "JobId=57 JobName=x UserId=root(0) JobState=RUNNING SubmitTime=2026-11-20T12:00:00 "
        "EligibleTime=2026-11-20T12:00:10 AccrueTime=Unknown StartTime=2026-11-20T12:05:00 "
        "EndTime=2026-11-20T12:35:00"
    )
    assert queue_times.parse_job_times(line) == {
        "submitted": T0,
        "eligible": T0 + 10,
        "started": T0 + 300,
    }
    assert queue_times.parse_job_times("") == dict.fromkeys(("submitted", "eligible", "started"))
    starts = "58|2026-11-20T13:00:00\n59|N/A\n"
    assert queue_times.parse_expected_starts(starts) == {"58": T0 + 3600}


def test_waits_count_from_the_previous_segments_end_or_a_new_runs_submission():
    records = [
        # submitted at T0, started 10 min later: waited 600 s
        record(1, 2.0, T0 + 600, T0 + 600 + 260, submitted=T0),
        # a chain's successor: submitted when seg1's job started, eligible at its end,
        # started 120 s after seg1 ended
        record(2, 2.2, T0 + 980, T0 + 980 + 280, submitted=T0 + 600, eligible=T0 + 860),
        # submitted a day later (the campaign was stopped): its wait counts from then
        record(3, 2.4, T0 + 86400 + 30, T0 + 86400 + 330, submitted=T0 + 86400),
        # a controller restarted 3 min after segment 3's end: the downtime is no queue wait
        record(4, 2.4, T0 + 86400 + 540, T0 + 86400 + 840, submitted=T0 + 86400 + 510),
    ]
    m = calendar.measured(records)
    assert [x.wait_seconds for x in m] == [600, 120, 30, 30]
    m = m[:3]
    assert [x.job_seconds for x in m] == [260, 280, 300]
    rate = calendar.rate_of(m)
    # weighed newest first: 2.0 / 4 + 2.2 / 4 + 2.4 / 2; the range: slowest to fastest,
    # at least ±10 %
    assert (rate.seconds, rate.low, rate.high) == pytest.approx((2.25, 2.0, 2.475))
    assert rate.source == "2.25 s/iteration over 3 segments, the newest weighted most"
    # start-up and save: job time less iterations x rate: 60, 60, 60 (range: at least ±50 %)
    overhead = calendar.overhead_of(m, rate)
    assert (overhead.seconds, overhead.low, overhead.high) == pytest.approx((60, 30, 90))
    wait = calendar.wait_of(m)
    assert (wait.seconds, wait.low, wait.high, wait.source) == (
        120,
        30,
        600,
        "measured over 3 jobs",
    )


def test_the_finish_is_laid_out_segment_by_segment_with_a_range():
    rate = calendar.Rate(2.0, 1.5, 3.0, "2 s/iteration over 2 segments")
    overhead = calendar.Overhead(60, "measured")
    wait = calendar.Wait(100, 10, 1000, "measured over 2 jobs")
    # segment 3 running since T0 (its job started), segment 4 still to start
    f = calendar.forecast(T0 + 50, [100, 100], rate, overhead, wait, running_since=T0)
    assert f.segment_ends == (T0 + 260, T0 + 260 + 100 + 260)
    assert f.finish == T0 + 620
    # the interval sized per part: each moved alone to its ends (rate 1.5 s: 100 s earlier,
    # 3 s: 200 s later; wait 10 s: 90 s earlier, 1000 s: 900 s later), added as independent
    # errors
    assert f.low == pytest.approx(T0 + 620 - math.hypot(100, 90))
    assert f.high == pytest.approx(T0 + 620 + math.hypot(200, 900))
    # a measured start-up and save's range counts too
    spread = calendar.Overhead(60, "measured", 40, 90)
    f = calendar.forecast(T0 + 50, [100, 100], rate, spread, wait, running_since=T0)
    assert f.low == pytest.approx(T0 + 620 - math.hypot(100, 90, 40))
    assert f.high == pytest.approx(T0 + 620 + math.hypot(200, 900, 60))
    assert (f.jobs_left, f.segments_left) == (1, 2)
    # a running segment that is behind: never before its iterations left can run
    late = calendar.forecast(
        T0 + 400, [100], rate, overhead, wait, running_since=T0, running_left=50
    )
    assert late.finish == T0 + 500
    # squeue --start's time for the next job replaces the measured wait; it counts other
    # jobs' whole limits, so it is the high end; the low end starts that job at once, the
    # central the middle of the two (the running job's end, T0 + 260, and T0 + 3600)
    f = calendar.forecast(
        T0, [100, 100], rate, overhead, wait, running_since=T0, expected_starts=[T0 + 3600]
    )
    assert f.segment_ends[1] == T0 + 1930 + 260
    # per part: the wait from at once (T0 + 260: 1670 s earlier) to squeue's (1670 s
    # later); the rate (1.5 s: the middle from T0 + 210, 75 s earlier; 3 s: 150 s later)
    assert f.low == pytest.approx(T0 + 2190 - math.hypot(75, 1670))
    assert f.high == pytest.approx(T0 + 2190 + math.hypot(150, 1670))
    assert f.squeue_starts == 1


def test_without_measurements_the_plans_rate_and_stated_defaults_are_used():
    f = calendar.campaign_forecast(EXP, [], 0, T0, model_seconds=3.0)
    assert f.rate.source == (
        "3 s/iteration from the plan's model estimate (not measured: range ±25%, assumed)"
    )
    assert (f.rate.low, f.rate.high) == pytest.approx((2.25, 3.75))
    assert f.overhead.source == "assumed, not measured"
    assert f.wait.seconds is None
    assert f.finish == T0 + 4 * (300 + 300)
    # per part: the rate ±75 s a segment, start-up and save -225 s / +900 s
    assert f.low == pytest.approx(T0 + 2400 - math.hypot(4 * 75, 4 * 225))
    assert f.high == pytest.approx(T0 + 2400 + math.hypot(4 * 75, 4 * 900))
    line = calendar.describe(f)
    assert "queue wait unknown, not included" in line
    assert "4 segments and 4 jobs left" in line
    # the canary's segments give the start-up and save
    f = calendar.campaign_forecast(EXP, [], 0, T0, model_seconds=3.0, canary=[20.0, 40.0])
    assert (f.overhead.seconds, f.overhead.source) == (30, "the canary's segments")
    # no rate at all: no forecast
    assert calendar.campaign_forecast(EXP, [], 0, T0) is None
    assert calendar.campaign_forecast(EXP, [], 400, T0, model_seconds=3.0) is None  # done


def test_the_line_names_its_sources_like_the_documented_one():
    rate = calendar.Rate(2.41, 2.3, 2.6, "2.41 s/iteration over 3 segments")
    f = calendar.forecast(
        T0,
        [100] * 4,
        rate,
        calendar.Overhead(120, "measured"),
        calendar.Wait(4320, 600, 30000, "measured over 3 jobs"),
    )
    line = calendar.describe(f)
    # each of 4 jobs: the wait, 120 s, 100 iterations (low: 2.3 s and 600 s; high: 2.6 s
    # and 30000 s); the next day's bound names its day
    zone = time.strftime("%Z", time.localtime(f.finish))
    assert line.startswith(
        f"expected to finish: 2026-11-20 17:12 {zone} (80 % interval: 13:04 to 21st 21:44), "
    ), line
    assert ", from: 2.41 s/iteration over 3 segments, 4 segments and 4 jobs left" in line
    assert line.endswith(
        "start-up and save 2 min per segment (measured), queue wait 1.2 h each (measured "
        "over 3 jobs)"
    )
    # a pending job's squeue --start time is its own: the others wait the measured wait
    f = calendar.forecast(
        T0, [100] * 2, rate, calendar.Overhead(120, "measured"),
        calendar.Wait(60, 30, 90, "measured over 2 jobs"), expected_starts=[T0 + 600],
    )  # fmt: skip
    assert calendar.describe(f).endswith(
        "queue: the next job at squeue --start's time (the interval reaches back to starting "
        "at once: it counts other jobs' time limits), the others 60 s each (measured over 2 "
        "jobs)"
    )
    assert f.segment_ends == (T0 + 300 + 361, T0 + 300 + 361 + 60 + 361)
    # no spread at all: still a range, of one time
    flat = calendar.forecast(
        T0, [100], calendar.Rate(2, 2, 2, "x"), calendar.Overhead(60, "measured"),
        calendar.Wait(0, 0, 0, "measured over 1 job"), running_since=T0,
    )  # fmt: skip
    assert "(80 % interval: 12:04:20 to 12:04:20)" in calendar.describe(flat)


def test_a_segment_job_records_its_prediction_and_keeps_every_one(tmp_path):
    save, results = tmp_path / "checkpoints" / "x", tmp_path / "results"
    results.mkdir(parents=True)
    seg1 = record(1, 2.0, T0, T0 + 260, submitted=T0 - 40)
    (results / "seg1.json").write_text(json.dumps(seg1))
    # segment 1's job waited 40 s; segment 2's started 40 s after segment 1's end
    timing = calendar.segment_start(
        EXP, 2, 100, [save / "chain", results], save, "58",
        {"submitted": T0 + 100, "eligible": T0 + 260, "started": T0 + 300}, now=T0 + 310,
    )  # fmt: skip
    p = timing["prediction"]
    assert p["segment_end"] == T0 + 300 + 60 + 200
    # 2 more jobs, each after the measured wait (40 s)
    assert p["campaign_end"] == p["segment_end"] + 2 * (40 + 60 + 200)
    assert p["wait"]["source"] == "measured over 2 jobs"
    timing = calendar.segment_end(timing, [{"elapsed time per iteration (ms)": 2100.0}])
    assert timing["seconds_per_iteration"] == 2.1 and timing["ended"] >= timing["training_started"]
    # a second attempt appends: the first prediction stays
    calendar.segment_start(EXP, 2, 150, [results], save, "59", {}, now=T0 + 900)
    lines = (save / "chain" / calendar.PREDICTIONS).read_text().splitlines()
    assert [json.loads(x)["job"] for x in lines] == ["58", "59"]
    # the first segment has nothing to rate the campaign with
    first = calendar.segment_start(EXP, 1, 0, [tmp_path / "none"], save, "57", {}, now=T0)
    assert first["prediction"] is None


def test_the_page_sets_each_prediction_against_what_happened():
    recs = [record(k, 2.0, T0 + 300 * k, T0 + 300 * k + 260) for k in (1, 2, 3, 4)]
    recs[1]["timing"]["prediction"] = {
        "made_at": T0 + 600, "segment_end": T0 + 850, "campaign_end": T0 + 1500,
        "campaign_low": T0 + 1400, "campaign_high": T0 + 1700, "line": "x",
    }  # fmt: skip
    (row,) = calendar.prediction_rows(recs)
    assert row["segment"] == 2
    assert row["segment_error_s"] == 850 - 860
    assert row["campaign_actual"] == T0 + 1460 and row["campaign_error_s"] == 40
    # an unfinished campaign: no campaign end yet
    (row,) = calendar.prediction_rows(recs[:3])
    assert row["campaign_actual"] is None and row["campaign_error_s"] is None


def test_before_any_segment_the_layout_search_measurement_rates_the_campaign(tmp_path):
    """layout: auto's measuring job timed the chosen layout at full size on the site: the
    plan, status and the first segment's own prediction use it before any segment ran,
    and the campaign's own segments once they have."""
    assert calendar.layout_measurement("x", tmp_path) is None  # not measured (yet)
    path = tmp_path / "results" / "layout" / "x.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({
        "nodes": 2, "chosen": {"tp": 2, "micro": 2, "measured_s": 2.5},
        "candidates": [{"micro": 2, "measured_s": 2.5}, {"micro": 4, "measured_s": 2.9}],
    }))  # fmt: skip
    layout = calendar.layout_measurement("x", tmp_path)
    assert layout == (2.5, 2)
    f = calendar.campaign_forecast(EXP, [], 0, T0, model_seconds=3.0, layout=layout)
    assert f.rate.seconds == 2.5  # the measurement, not the model estimate
    assert f.rate.source == (
        "2.5 s/iteration measured by layout: auto's measuring job on 2 nodes "
        "(a few iterations: range ±10%, assumed)"
    )
    # the first segment's job predicts from it (without it: no prediction)
    save = tmp_path / "checkpoints" / "x"
    first = calendar.segment_start(EXP, 1, 0, [tmp_path / "none"], save, "57", {},
                                   now=T0, layout=layout)  # fmt: skip
    assert first["prediction"]["segment_end"] == T0 + 300 + 100 * 2.5
    # once a segment ran, its own rate wins
    seg1 = calendar.measured([record(1, 2.0, T0, T0 + 260)])
    assert calendar.rate_of(seg1, 3.0, layout).seconds == 2.0
    # a broken record is the plan's to refuse: the calendar just has no measurement
    path.write_text("{")
    assert calendar.layout_measurement("x", tmp_path) is None


def two_done():
    """Segments 1 and 2 of EXP trained at 2 s/iteration, each 40 s of start-up and save
    after a 30 s wait; segment 2 ended at T0 + 540."""
    return [
        record(1, 2.0, T0 + 30, T0 + 270, submitted=T0),
        record(2, 2.0, T0 + 300, T0 + 540, submitted=T0 + 30, eligible=T0 + 270),
    ]


@pytest.mark.parametrize("squeue_start", [T0 + 900, None])
def test_a_forecast_does_not_move_when_only_the_clock_moves(squeue_start):
    """4 segments, 2 done, job 3 pending (squeue --start's same expected start, or none,
    submitted at segment 2's end): as the clock advances, the finish stays (without a
    squeue time: while job 3 has waited less than the measured waits, 30 s; later its
    wait so far counts: it starts no earlier than now)."""
    finishes, ranges = set(), set()
    for dt in (0, 20, 40, 60, 120, 170) if squeue_start else (0, 10, 20, 30):
        f = calendar.campaign_forecast(
            EXP, two_done(), 200, T0 + 540 + dt,
            expected_starts=[squeue_start], pending_since=T0 + 541,
        )  # fmt: skip
        finishes.add(f.finish)
        ranges.add(f.high)
        assert f.low < f.finish < f.high
        assert (f.segments_left, f.jobs_left) == (2, 2)
    assert len(finishes) == 1 and len(ranges) == 1, (finishes, ranges)
    (finish,) = finishes
    if squeue_start:  # job 3 between when it could start and squeue's time, job 4 after
        # the measured wait (30 s)
        assert finish == (T0 + 541 + squeue_start) / 2 + 240 + 30 + 240
    else:  # both after the measured wait, job 3's counted from when it could start
        assert finish == T0 + 541 + 30 + 240 + 30 + 240


def test_the_running_job_is_counted_by_its_own_progress():
    """Segment 3's job has saved its last checkpoint (iteration 300) and still runs
    (its record not written): it is segment 3's job, not the next segment's."""
    recs = two_done()
    f = calendar.campaign_forecast(
        EXP, recs, 300, T0 + 805, running_since=T0 + 570, running_logged=300,
        running_segment=3, running_start_iteration=200,
    )  # fmt: skip
    assert (f.segments_left, f.jobs_left) == (2, 1)
    assert f.segment_ends[0] == T0 + 570 + 40 + 100 * 2.0  # its own end, not the next's
    assert f.finish == f.segment_ends[0] + 30 + 40 + 200
    # halfway through its iterations, slower than the rate: its log's progress counts
    f = calendar.campaign_forecast(
        EXP, recs, 200, T0 + 800, running_since=T0 + 570, running_logged=240,
        running_segment=3, running_start_iteration=200,
    )  # fmt: skip
    assert f.segment_ends[0] == T0 + 800 + 60 * 2.0
    # the very end: the final checkpoint saved, its record not yet written: a date
    recs3 = [*recs, record(3, 2.0, T0 + 570, T0 + 810, submitted=T0 + 300, eligible=T0 + 540)]
    f = calendar.campaign_forecast(
        EXP, recs3, 400, T0 + 1075, running_since=T0 + 840, running_logged=400,
        running_segment=4, running_start_iteration=300,
    )  # fmt: skip
    assert f is not None and f.finish == T0 + 840 + 240 and f.jobs_left == 0
    # past its expected end it ends no earlier than now
    late = calendar.campaign_forecast(
        EXP, recs3, 400, T0 + 1200, running_since=T0 + 840, running_logged=400,
        running_segment=4, running_start_iteration=300,
    )  # fmt: skip
    assert late.finish == T0 + 1200
    assert "no job left to start" in calendar.describe(f)


def test_the_running_jobs_own_wait_counts_among_the_measured_waits():
    f = calendar.campaign_forecast(
        EXP, two_done(), 200, T0 + 700, running_since=T0 + 699, running_logged=200,
        running_job={"submitted": T0 + 300, "eligible": T0 + 540, "started": T0 + 693},
    )  # fmt: skip
    # its end counts from Slurm's start (as the measured start-up and save does), not from
    # its attempt's (after the launch)
    assert f.segment_ends[0] == T0 + 693 + 40 + 200
    assert f.wait.source == "measured over 3 jobs"
    assert (f.wait.seconds, f.wait.low, f.wait.high) == (30, 30, 153)
    assert f.high >= f.segment_ends[0] + 153 + 240


def test_segment_one_is_rated_by_its_own_iterations_once_it_logged_some():
    rows = [{"elapsed time per iteration (ms)": ms} for ms in (2000.0, 2100.0, 2200.0)]
    running = {**calendar.iteration_times(rows), "iterations": 3}
    f = calendar.campaign_forecast(
        EXP, [], 3, T0 + 60, model_seconds=3.0, running_since=T0, running_logged=3,
        running_rate=running,
    )  # fmt: skip
    assert f.rate.seconds == 2.1
    assert f.rate.source == ("2.1 s/iteration over the running segment's first 3 logged iterations")
    assert f.rate.low < 2.1 < f.rate.high
    # its start-up too: 60 s since its job started, 3 iterations of 2.1 s logged
    assert f.overhead.source == "start-up measured by the running job, save assumed as long"
    assert (f.overhead.seconds, f.overhead.low) == pytest.approx((2 * 53.7, 53.7))
    # before it logged any: the plan's model rate, said so
    f = calendar.campaign_forecast(EXP, [], 0, T0 + 5, model_seconds=3.0, running_since=T0)
    assert "from the plan's model estimate" in f.rate.source


def predicted(rec, made_at, ends):
    """``rec`` with the prediction its job made at ``made_at``: segment ends ``ends``."""
    rec["timing"]["prediction"] = {
        "made_at": made_at, "segment_end": ends[0], "segment_ends": list(ends),
        "campaign_end": ends[-1], "campaign_low": ends[-1], "campaign_high": ends[-1],
    }  # fmt: skip
    return rec


def test_the_campaigns_own_past_errors_widen_the_interval():
    """Segment 1's job predicted segment 1 at T0 + 250 and 2 at T0 + 500 (made at T0 +
    30); they ended at T0 + 270 and T0 + 540. Segment 2's job predicted its end at T0 +
    520. Errors, late, as a share of the time left: 20/240, 40/510, 20/240."""
    recs = two_done()
    predicted(recs[0], T0 + 30, [T0 + 250, T0 + 500, T0 + 750, T0 + 1000])
    predicted(recs[1], T0 + 300, [T0 + 520, T0 + 760, T0 + 1000])
    errors = calendar.past_errors(recs)
    assert errors == pytest.approx([20 / 240, 40 / 510, 20 / 240])
    # old records: their own segment's end only
    old = two_done()
    predicted(old[0], T0 + 30, [T0 + 250])
    old[0]["timing"]["prediction"].pop("segment_ends")
    assert calendar.past_errors(old) == pytest.approx([20 / 240])
    # a forecast whose interval is narrower than the first two errors: widened, said so
    rate = calendar.Rate(2.0, 2.0, 2.0, "2 s/iteration over 2 segments")
    narrow = calendar.forecast(
        T0 + 540, [100, 100], rate, calendar.Overhead(40, "measured"),
        calendar.Wait(0, 0, 0, "measured over 2 jobs", 2),
    )  # fmt: skip
    assert narrow.low == narrow.finish == narrow.high
    left = narrow.finish - narrow.now
    f = calendar.calibrate(narrow, errors[:2])
    # with 2 errors the conformal 90 % quantile is the larger; too few to move the date
    assert f.high == pytest.approx(narrow.finish + 20 / 240 * left)
    assert f.low == narrow.low  # no prediction was early
    assert f.finish == narrow.finish
    assert (
        "interval widened to their spread (up to 8% late, 0% early of the time left): this "
        "campaign's own errors (2 earlier predictions of segment ends)"
    ) in calendar.describe(f)
    # one wide enough already is kept, and said to hold them
    wide = calendar.forecast(
        T0 + 540, [100, 100], calendar.Rate(2.0, 1.5, 3.0, "x"), calendar.Overhead(40, "m"),
        calendar.Wait(0, 0, 0, "measured over 2 jobs", 2),
    )  # fmt: skip
    g = calendar.calibrate(wide, errors[:2])
    assert (g.low, g.high, g.finish) == (wide.low, wide.high, wide.finish)
    assert g.calibration == (
        "interval holds their spread: this campaign's own errors (2 earlier predictions of "
        "segment ends)"
    )
    # with 3 errors the date stays the model's (the errors' median does not move it); the
    # high end reaches the largest late error, the segments' ends stay the model's
    h = calendar.calibrate(narrow, errors)
    assert h.finish == narrow.finish and h.segment_ends == narrow.segment_ends
    assert h.high == pytest.approx(narrow.finish + 20 / 240 * left)
    assert h.calibration.startswith("interval widened to their spread (up to 8% late")
    # through campaign_forecast: the records' errors count
    k = calendar.campaign_forecast(EXP, recs, 200, T0 + 540, pending_since=T0 + 541)
    assert k.calibration is not None and k.finish == k.segment_ends[-1]


def test_the_conformal_quantile_takes_the_largest_of_few_errors():
    assert calendar._conformal([0.1, 0.3, 0.2], 0.9) == 0.3
    values = [i / 100 for i in range(1, 21)]  # 20 values: the 19th (ceil(21 * 0.9) = 19)
    assert calendar._conformal(values, 0.9) == 0.19


def test_a_segment_job_records_every_segment_end_it_predicts(tmp_path):
    folder = tmp_path / "chain"
    folder.mkdir()
    for rec in two_done():
        (folder / f"seg{rec['segment']}.json").write_text(json.dumps(rec))
    timing = calendar.segment_start(
        EXP, 3, 200, [folder], tmp_path / "save", "3",
        {"submitted": T0 + 300, "eligible": T0 + 540, "started": T0 + 570}, now=T0 + 575,
    )  # fmt: skip
    p = timing["prediction"]
    assert len(p["segment_ends"]) == 2 and p["segment_ends"][0] == p["segment_end"]
    assert p["segment_ends"][-1] == p["campaign_end"]


def test_controller_downtime_is_no_error_of_a_prediction():
    """Segment 2's job was submitted 100 s after segment 1 ended (its controller was
    stopped): segment 1's prediction of segment 2's end is judged without those 100 s."""
    one = predicted(record(1, 2.0, T0 + 30, T0 + 270, submitted=T0), T0 + 30,
                    [T0 + 270, T0 + 540])  # fmt: skip
    two = record(2, 2.0, T0 + 400, T0 + 640, submitted=T0 + 370)
    assert calendar.past_errors([one, two]) == pytest.approx([0.0, 0.0])
    # a chain's successor, submitted while segment 1 ran: its wait is an error
    three = record(2, 2.0, T0 + 400, T0 + 640, submitted=T0 + 30)
    assert calendar.past_errors([one, three]) == pytest.approx([0.0, 100 / 610])


def _rows(*seconds):
    return [{"elapsed time per iteration (ms)": s * 1000} for s in seconds]


def test_the_running_segments_speed_now_rates_its_own_iterations_and_weighs_on_the_rest():
    """Segments 1 and 2 ran 2 s/iteration; segment 3's job (started at T0 + 570: 30 s of
    start-up) ran its first 20 logged iterations at 2 s, then slowed to 3 s (another job
    on its node) for 20: its speed now is 3 s (its newest quarter, at least 5 rows), its
    40 iterations took 100 s. Its 60 left take 180 s from now, then the 40 s of start-up
    and save less the 30 s its start-up took; segment 4 at 2 s / 4 + 2 s / 4 + 3 s / 2
    = 2.5 s. The median of the segments (2 s) would have kept the old speed."""
    running = calendar.running_times(_rows(*[2.0] * 20, *[3.0] * 20))
    assert running["recent"] == 3.0 and running["iterations"] == 40
    assert running["seconds_per_iteration"] == 2.5  # the median of all 40
    now = T0 + 570 + 30 + 100
    f = calendar.campaign_forecast(
        EXP, two_done(), 200, now, running_since=T0 + 570, running_logged=240,
        running_segment=3, running_start_iteration=200,
        running_job={"submitted": T0 + 300, "eligible": T0 + 540, "started": T0 + 570},
        running_rate=running,
    )  # fmt: skip
    assert f.rate.seconds == pytest.approx(2.5) and f.rate.current == 3.0
    assert f.rate.source == (
        "2.5 s/iteration over 2 segments and the running one's newest iterations (3 s), the "
        "newest weighted most"
    )
    # its own 40 iterations at its own median (2.5 s): 100 s; its start-up so far:
    # now - T0 - 570 - 100 = 30 s
    assert f.segment_ends[0] == pytest.approx(now + 60 * 3.0 + (40 - 30))
    # segment 4's job waits the measured 30 s, then 40 s and 100 iterations at 2.5 s
    assert f.segment_ends[1] == pytest.approx(f.segment_ends[0] + 30 + 40 + 250)
    # the finish does not move as the clock does while nothing is logged: its newest line
    # stays, the start-up so far grows by as much
    later = calendar.campaign_forecast(
        EXP, two_done(), 200, now + 2, running_since=T0 + 570, running_logged=240,
        running_segment=3, running_start_iteration=200,
        running_job={"submitted": T0 + 300, "eligible": T0 + 540, "started": T0 + 570},
        running_rate=running,
    )  # fmt: skip
    assert later.finish == pytest.approx(f.finish)
    # too few rows of its own to weigh on the later segments: its speed now rates its own
    few = calendar.rate_of(calendar.measured(two_done()), running=calendar.running_times(
        _rows(3.0, 3.0, 3.0)))  # fmt: skip
    assert (few.seconds, few.current) == (2.0, None)


def test_speeds_that_change_between_segments_are_followed_newest_first():
    """Segment speeds 0.16, 0.09 (a restart's: the machine got quieter) and 0.09, 0.09,
    0.13 (a slowdown): the newest weighs as much as all before it."""
    quieter = [record(1, 0.16, T0, T0 + 100), record(2, 0.09, T0 + 100, T0 + 170)]
    assert calendar.rate_of(calendar.measured(quieter)).seconds == pytest.approx(0.125)
    slower = [
        record(1, 0.09, T0, T0 + 29), record(2, 0.09, T0 + 70, T0 + 99),
        record(3, 0.13, T0 + 140, T0 + 213),
    ]  # fmt: skip
    rate = calendar.rate_of(calendar.measured(slower))
    assert rate.seconds == pytest.approx(0.11) and (rate.low, rate.high) == (0.09, 0.13)
    # start-up and save the same way: 20, 20, 60 s (a job's time less its iterations)
    overhead = calendar.overhead_of(calendar.measured(slower), rate)
    assert (overhead.seconds, overhead.low, overhead.high) == pytest.approx((40, 20, 60))


def test_a_pending_job_with_a_squeue_time_waits_by_the_queue_now_up_to_that_time():
    """Segment 3's job is pending (squeue --start: T0 + 800, other jobs at their whole
    limits); the queue now says 100 s central, 20 s low, 200 s high: the central and low
    are the queue's, the high squeue's own."""
    from hpcllm.training.campaign.queue_state import QueueJob, QueueState

    queue = QueueState(T0 + 540, 2, (QueueJob("70", "RUNNING", 2, 260, 60),), "batch")
    f = calendar.campaign_forecast(
        EXP, two_done(), 200, T0 + 541, expected_starts=[T0 + 800], pending_since=T0 + 300,
        queue=queue, mine=["1", "2", "3"], nodes=2,
    )  # fmt: skip
    # job 70 has 200 s of its limit left (read at T0 + 540): central half of it, low a
    # tenth; the high end is squeue's time (T0 + 800), not the queue's (T0 + 740); from
    # now (T0 + 541)
    assert f.queue_wait == pytest.approx((99, 19, 259))
    assert f.segment_ends[0] == pytest.approx(T0 + 640 + 40 + 200)
    line = calendar.describe(f)
    assert "queue: the next job waits 99 s (19 s to 4 min) by the queue now" in line, line
    assert "(the high end: squeue --start's time)" in line
    # squeue --start earlier than the queue's central: no later than squeue's time
    g = calendar.campaign_forecast(
        EXP, two_done(), 200, T0 + 541, expected_starts=[T0 + 600], pending_since=T0 + 300,
        queue=queue, mine=["1", "2", "3"], nodes=2,
    )  # fmt: skip
    assert g.queue_wait == pytest.approx((59, 19, 59))


def test_the_running_jobs_start_up_counts_its_iterations_by_the_time_they_took():
    """Segment 1's job started at T0 and logged 15 iterations: 10 of 1 s, then 5 of 4 s
    (its speed now). They took 30 s (their mean times 15); 40 s since its start leave 10
    s of start-up. At its speed now they would have taken 60 s, longer than it ran: the
    forecast fell back to an assumed 5 min start-up and save (benchmark run 9, one poll
    506 % off)."""
    running = calendar.running_times(_rows(*[1.0] * 10, *[4.0] * 5))
    assert (running["recent"], running["mean"]) == (4.0, 2.0)
    f = calendar.campaign_forecast(
        EXP, [], 15, T0 + 40, model_seconds=3.0, running_since=T0, running_logged=15,
        running_rate=running,
    )  # fmt: skip
    assert f.overhead.source == "start-up measured by the running job, save assumed as long"
    assert f.overhead.seconds == pytest.approx(2 * 10)
    # its 85 iterations left at 4 s after its newest line, then its save (10 s)
    assert f.segment_ends[0] == pytest.approx(T0 + 40 + 85 * 4 + 10)
