"""A segment job's own prediction (hpcllm.training.campaign.calendar.segment_start,
job_timing) reads the partition's queue as ``hpcllm status`` does: other jobs ahead of
the chain's successor push the campaign's end later, the successor's ``squeue --start``
time bounds the high end, and where the queue cannot be read the line says so."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import pytest
from training_helpers import segment_record

from hpcllm.training.campaign import calendar, queue_state
from hpcllm.training.campaign.chain import job_name_of
from hpcllm.training.campaign.queue_state import QueueJob, QueueState
from hpcllm.training.plan.experiment import Paths

T0 = datetime(2026, 11, 20, 12, 0, 0).timestamp()
# 4 segments of 100 iterations, each job on both nodes of a 2-node partition
EXP = {"segments": 4, "iterations_per_segment": 100, "layout": {"nodes": 2}}
KEYS = {"made_at", "segment_end", "segment_ends", "campaign_end", "campaign_low",
        "campaign_high", "rate", "overhead", "wait", "line"}  # fmt: skip


def record(k, job_started, ended, submitted, eligible=None):
    """Segment k of EXP: 100 iterations at 2 s each, 40 s of start-up and save."""
    return segment_record(k, 2.0, job_started, ended, submitted, eligible)


def two_done(folder: Path, t0: float) -> None:
    """Segments 1 and 2 trained, each after a 30 s wait; segment 2 ended at t0 + 540."""
    folder.mkdir(parents=True, exist_ok=True)
    for rec in (
        record(1, t0 + 30, t0 + 270, submitted=t0),
        record(2, t0 + 300, t0 + 540, submitted=t0 + 30, eligible=t0 + 270),
    ):
        (folder / f"seg{rec['segment']}.json").write_text(json.dumps(rec))


# segment 3's job: submitted when segment 2's started, eligible at its end, started 30 s
# later; it predicts 5 s after its start
JOB3 = {"submitted": T0 + 300, "eligible": T0 + 540, "started": T0 + 570}
NOW = T0 + 575
# this job's segment ends at its start + 40 s + 100 x 2 s (the measured model)
SEG3_END = T0 + 570 + 40 + 200


def queue(*others: QueueJob) -> QueueState:
    """The partition now: our running job 3 and its pending successor 4 (priority 1000)
    on both of its 2 nodes, and ``others``."""
    ours = (
        QueueJob("3", "RUNNING", 2, 3600, 5, 1000),
        QueueJob("4", "PENDING", 2, 3600, 0, 1000),
    )
    return QueueState(at=NOW, nodes=2, jobs=(*ours, *others), partition="batch")


def predict(tmp_path, **queue_args) -> dict:
    folder = tmp_path / "chain"
    two_done(folder, T0)
    timing = calendar.segment_start(
        EXP, 3, 200, [folder], tmp_path / "save", "3", JOB3, now=NOW, **queue_args
    )
    p = timing["prediction"]
    assert set(p) == KEYS  # what the results page, coverage and past_errors read
    return p


def test_an_empty_queue_starts_the_successor_at_this_jobs_end(tmp_path):
    p = predict(tmp_path, queue=queue(), mine=["3", "4"])
    assert p["segment_end"] == SEG3_END
    # nothing ahead of job 4: it starts as job 3 ends (central), 40 + 200 s of its own
    assert p["campaign_end"] == SEG3_END + 240
    assert "queue: the next job waits 0 s (0 s to 30 s) by the queue now: 0 other jobs on " \
        "batch's 2 nodes" in p["line"], p["line"]  # fmt: skip
    assert "not read" not in p["line"]


def test_another_job_ahead_pushes_the_campaign_end_later_by_its_share_of_its_limit(tmp_path):
    """Another user's job of 2 nodes, 10 min limit, pending ahead of our successor (higher
    priority): job 4 starts after it, which is assumed to run 50 % of its limit (10 % to
    all of it): the end moves 300 s later (60 s to 600 s)."""
    empty = predict(tmp_path / "empty", queue=queue(), mine=["3", "4"])
    ahead = QueueJob("90", "PENDING", 2, 600, 0, 2000)
    p = predict(tmp_path / "ahead", queue=queue(ahead), mine=["3", "4"])
    assert p["segment_end"] == empty["segment_end"]  # this job's own segment: unchanged
    assert p["campaign_end"] - empty["campaign_end"] == pytest.approx(300)
    # the interval per part: the wait alone moves the end 240 s earlier (it runs 10 % of
    # its limit) and 300 s later (all of it; the measured 30 s waits: shorter); the rate's
    # and start-up and save's moves are added as independent errors, so less than their sum
    assert p["campaign_end"] - p["campaign_low"] > 240
    assert p["campaign_high"] - p["campaign_end"] > 300
    assert p["campaign_high"] - p["campaign_end"] < 300 + (
        empty["campaign_high"] - empty["campaign_end"]
    )
    assert "waits 5 min (60 s to 10 min) by the queue now: 1 other job on batch's 2 nodes " \
        "(0 running, 1 pending" in p["line"], p["line"]  # fmt: skip
    # the later jobs' wait: the queue now's, longer than the measured 30 s
    assert p["wait"]["source"] == "measured over 3 jobs and the queue now"
    # the same job behind ours (lower priority) does not delay it: the successor is
    # recognised as ours, from ``mine``
    behind = predict(tmp_path / "behind", queue=queue(QueueJob("91", "PENDING", 2, 600, 0, 10)),
                     mine=["3", "4"])  # fmt: skip
    assert behind["campaign_end"] == empty["campaign_end"]
    assert "1 of them behind ours" in behind["line"]
    # without knowing job 4 is ours, it would count as another job ahead of the next one
    stranger = predict(tmp_path / "stranger", queue=queue(ahead), mine=["3"])
    assert stranger["campaign_end"] > p["campaign_end"]


def test_the_successors_squeue_start_bounds_the_high_end(tmp_path):
    """squeue --start's time for job 4 (the scheduler counts other jobs' whole limits):
    the high end starts it then; the central and low are the queue now's (empty: at once).
    Without the queue, the central is half way between."""
    start = T0 + 1200
    p = predict(tmp_path, queue=queue(), mine=["3", "4"], expected_starts=[start])
    assert p["campaign_end"] == pytest.approx(SEG3_END + 240)
    # the wait alone at its high end: job 4 starts at squeue's time, then its 40 s and
    # 100 x 2 s; the rate's and start-up and save's moves added as independent errors
    assert start + 240 <= p["campaign_high"] < start + 60 + 220
    assert "(the high end: squeue --start's time)" in p["line"], p["line"]
    later = predict(tmp_path / "later", queue=queue(), mine=["3", "4"],
                    expected_starts=[start + 600])  # fmt: skip
    assert 550 < later["campaign_high"] - p["campaign_high"] <= 600
    unread = predict(tmp_path / "unread", expected_starts=[start])
    assert unread["campaign_end"] == pytest.approx(SEG3_END + (start - SEG3_END) / 2 + 240)
    assert "queue: the next job at squeue --start's time" in unread["line"], unread["line"]


def test_without_the_queue_the_line_says_it_was_not_read(tmp_path):
    why = "squeue or sinfo -p batch could not be asked from the job's node"
    p = predict(tmp_path, queue_unread=why)
    # the measured waits (30 s each) alone
    assert p["campaign_end"] == SEG3_END + 30 + 240
    assert p["wait"]["source"] == "measured over 3 jobs"
    assert p["line"].endswith(f"; the partition's queue not read ({why}): measured waits only")
    # every job still to start has a squeue --start time: nothing missing, nothing said
    timed = predict(tmp_path / "timed", queue_unread=why, expected_starts=[T0 + 1200])
    assert "not read" not in timed["line"]
    # the last segment: no job left to start, nothing missing either
    folder = tmp_path / "last" / "chain"
    two_done(folder, T0)
    (folder / "seg3.json").write_text(json.dumps(record(3, T0 + 570, T0 + 810, T0 + 300)))
    last = calendar.segment_start(EXP, 4, 300, [folder], tmp_path / "last" / "save", "4", {},
                                  now=T0 + 840, queue_unread=why)["prediction"]  # fmt: skip
    assert "no job left to start" in last["line"] and "not read" not in last["line"]


# ---- in a job: Slurm's commands (stand-ins on PATH) read by job_timing

SCONTROL = "JobId=3 JobName=x SubmitTime={submitted} EligibleTime={eligible} StartTime={started}"


def stand_ins(folder: Path, partition: str, mine: str, starts: str, sinfo="2/0/0/2") -> Path:
    """squeue, sinfo, scontrol that print what the test cluster's would: the partition's
    jobs (``squeue -p``), this user's (``squeue --me``), expected starts (``--start``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("partition", partition), ("mine", mine), ("starts", starts),
                       ("sinfo.out", sinfo + "\n")):  # fmt: skip
        (folder / name).write_text(text)
    scripts = {
        "squeue": f'case "$*" in\n  *--start*) cat {folder}/starts ;;\n'
        f"  *-p\\ *) cat {folder}/partition ;;\n  *) cat {folder}/mine ;;\nesac\n",
        "sinfo": f"cat {folder}/sinfo.out\n",
        "scontrol": f"cat {folder}/scontrol.out\n",
    }
    for name, body in scripts.items():
        (folder / name).write_text("#!/bin/sh\n" + body)
        (folder / name).chmod(0o755)
    return folder


def slurm_time(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def in_a_job(tmp_path, monkeypatch, others: str, start: str = "N/A", squeue_refuses=False):
    """job_timing of segment 3 of experiment x, run in its working directory as chain job
    3 on partition batch (its successor 4 pending), 5 s after it started."""
    work = tmp_path / "work"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    t0 = time.time() - 575
    two_done(work / "checkpoints/x/chain", t0)
    chain = job_name_of(work, "x")
    ours = "3|RUNNING|2|1:00:00|0:05|1000\n4|PENDING|2|1:00:00|0:00|1000\n"
    bin_ = stand_ins(
        tmp_path / "bin",
        partition=ours + others,
        mine=f"3|RUNNING|(null)|None|{chain}\n4|PENDING|afterany:3(unfulfilled)|Dependency|"
        f"{chain}\n77|PENDING|(null)|Priority|another-run\n",
        starts=f"4|{start}\n77|N/A\n",
    )
    (bin_ / "scontrol.out").write_text(SCONTROL.format(
        submitted=slurm_time(t0 + 300), eligible=slurm_time(t0 + 540),
        started=slurm_time(t0 + 570)))  # fmt: skip
    if squeue_refuses:
        (bin_ / "squeue").write_text(
            "#!/bin/sh\necho 'squeue: error: Access/permission denied' >&2\nexit 1\n"
        )
    monkeypatch.setenv("PATH", f"{bin_}:/usr/bin:/bin")
    monkeypatch.setenv("SLURM_JOB_ID", "3")
    monkeypatch.setenv("SLURM_JOB_PARTITION", "batch")
    paths = Paths(save="checkpoints/x", record="results/train/x/seg3.json",
                  engine_log="x.log", data_cache="cache", tensorboard="tb")  # fmt: skip
    timing = calendar.job_timing(EXP, 3, 200, paths, "x")
    assert timing is not None
    kept = (work / "checkpoints/x/chain" / calendar.PREDICTIONS).read_text().splitlines()
    assert json.loads(kept[-1])["line"] == timing["prediction"]["line"]
    return timing


def test_a_job_reads_its_partitions_queue_and_its_successor(tmp_path, monkeypatch):
    empty = in_a_job(tmp_path / "empty", monkeypatch, others="")
    p0 = empty["prediction"]
    assert "by the queue now: 0 other jobs on batch's 2 nodes" in p0["line"], p0["line"]
    assert empty["job"]["started"] == pytest.approx(p0["made_at"] - 5, abs=2)
    ahead = in_a_job(tmp_path / "ahead", monkeypatch, others="90|PENDING|2|10:00|0:00|2000\n")
    p = ahead["prediction"]
    assert "by the queue now: 1 other job on batch's 2 nodes" in p["line"], p["line"]
    # its share of its limit (50 % of 10 min) later; the two jobs ran moments apart
    moved = (p["campaign_end"] - p["made_at"]) - (p0["campaign_end"] - p0["made_at"])
    assert moved == pytest.approx(300, abs=2)


def test_a_job_takes_its_successors_squeue_start(tmp_path, monkeypatch):
    start = time.time() + 900
    timing = in_a_job(tmp_path, monkeypatch, others="", start=slurm_time(start))
    p = timing["prediction"]
    assert "(the high end: squeue --start's time)" in p["line"], p["line"]
    # the high end: job 4 starts at squeue --start's time (whole seconds), then runs (its
    # start-up and save and rate central; their own moves added as independent errors)
    assert int(start) + 240 - 1 <= p["campaign_high"] <= int(start) + 60 + 220 + 1


def test_where_the_node_may_not_ask_slurm_the_job_predicts_from_measured_waits(
    tmp_path, monkeypatch
):
    timing = in_a_job(tmp_path, monkeypatch, others="", squeue_refuses=True)
    p = timing["prediction"]
    assert p["line"].endswith(
        "; the partition's queue not read (squeue or sinfo -p batch could not be asked from "
        "the job's node): measured waits only"
    ), p["line"]
    assert p["wait"]["source"] == "measured over 3 jobs"


def test_read_job_queue_names_what_it_could_not_read(tmp_path, monkeypatch):
    seen = calendar.read_job_queue("3", None, T0, environ={})
    assert seen.queue is None and seen.queue_unread == "the job's partition is not known"
    # a controller that does not answer: given up after the timeout (a hang guard)
    bin_ = stand_ins(tmp_path, partition="", mine="", starts="")
    (bin_ / "squeue").write_text("#!/bin/sh\nexec sleep 30\n")
    monkeypatch.setenv("PATH", f"{bin_}:/usr/bin:/bin")
    seen = calendar.read_job_queue("3", None, T0, {"SLURM_JOB_PARTITION": "batch"}, timeout=1)
    assert seen.queue is None and "could not be asked" in seen.queue_unread
    # the queue read, the chain's listing refused: the queue without the successor
    stand_ins(tmp_path, partition="3|RUNNING|2|1:00:00|0:05|1000\n", mine="", starts="")
    (bin_ / "squeue").write_text(
        '#!/bin/sh\ncase "$*" in\n  *-p\\ *) cat ' + f"{tmp_path}/partition ;;\n"
        "  *) echo 'squeue: error: denied' >&2; exit 1 ;;\nesac\n"
    )
    seen = calendar.read_job_queue("3", "hpcllm-chain-x", T0, {"SLURM_JOB_PARTITION": "batch"})
    assert seen.queue == QueueState(T0, 2, tuple(queue_state.parse_jobs(
        "3|RUNNING|2|1:00:00|0:05|1000\n")), "batch")  # fmt: skip
    assert seen.mine == ("3",) and seen.expected_starts == () and seen.queue_unread is None
