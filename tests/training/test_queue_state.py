"""The next job's wait from the partition's queue (hpcllm.training.campaign.queue_state):
squeue's and sinfo's output parsed, and the start placed first come, first served."""

from __future__ import annotations

import pytest

from hpcllm.training.campaign import calendar, queue_state
from hpcllm.training.campaign.queue_state import QueueJob, QueueState

T0 = 1_800_000_000.0

# what `squeue -h -p batch -o %i|%T|%D|%l|%M` printed on the test cluster, other users'
# jobs of the calibration benchmark and a chain job of ours
SQUEUE = """\
101|RUNNING|2|1:00|0:20
102|PENDING|1|1:00|0:00
103|PENDING|2|2-00:00:00|0:00
104|RUNNING|1|UNLIMITED|1-02:03:04
"""


def test_squeue_and_sinfo_output_is_parsed():
    jobs = queue_state.parse_jobs(SQUEUE + "garbage\n105|PENDING|x|1:00|0:00\n")
    assert [(j.id, j.state, j.nodes, j.limit_s, j.elapsed_s) for j in jobs] == [
        ("101", "RUNNING", 2, 60, 20),
        ("102", "PENDING", 1, 60, 0),
        ("103", "PENDING", 2, 172800, 0),
        ("104", "RUNNING", 1, None, 93784),
    ]
    assert queue_state.slurm_duration("NOT_SET") is None
    assert queue_state.slurm_duration("1:02:03") == 3723
    # allocated/idle/other/total: a drained node does not count
    assert queue_state.parse_usable_nodes("1/0/1/3\n0/2/0/2\n") == 4
    assert queue_state.parse_usable_nodes("sinfo: error\n") is None


def running(job_id, nodes, limit, elapsed):
    return QueueJob(job_id, "RUNNING", nodes, limit, elapsed)


def pending(job_id, nodes, limit):
    return QueueJob(job_id, "PENDING", nodes, limit, 0.0)


def test_an_empty_partition_starts_the_job_when_it_is_eligible():
    assert queue_state.start_after([], 2, 2, 30.0, 1.0) == 30.0
    # more nodes than the partition has: never
    assert queue_state.start_after([], 2, 3, 0.0, 1.0) is None


def test_running_jobs_free_their_nodes_at_their_limit_or_a_share_of_what_it_leaves():
    others = [running("1", 2, 60, 20)]  # 40 s left of its limit
    assert queue_state.start_after(others, 2, 1, 0.0, 1.0) == 40
    assert queue_state.start_after(others, 2, 1, 0.0, 0.5) == 20
    assert queue_state.start_after(others, 2, 1, 0.0, 0.1) == pytest.approx(4)
    # a job on one node of two leaves the other free
    assert queue_state.start_after([running("1", 1, 60, 0)], 2, 1, 0.0, 1.0) == 0
    # one without a limit holds its node for good
    assert queue_state.start_after([running("1", 2, None, 0)], 2, 1, 0.0, 1.0) is None


def test_pending_jobs_go_first_and_none_overtakes():
    # both nodes busy for 40 s more; a pending 2-node job of 60 s limit goes first, then
    # a pending 1-node job (30 s): ours (1 node) starts after the 2-node one, not before
    # the 1-node one although a node is free from 100 s
    others = [running("1", 2, 60, 20), pending("2", 2, 60), pending("3", 1, 30)]
    assert queue_state.start_after(others, 2, 1, 0.0, 1.0) == 100
    assert queue_state.start_after(others, 2, 2, 0.0, 1.0) == 130
    # eligible later than all that: at once
    assert queue_state.start_after(others, 2, 2, 200.0, 1.0) == 200
    # a pending job larger than the partition never runs and holds nobody up
    assert queue_state.start_after([pending("9", 5, 60)], 2, 2, 0.0, 1.0) == 0


def test_our_running_job_holds_its_nodes_until_our_next_job_is_eligible():
    # our 2-node job ends at 50 s; another user's 1-node job pends (60 s limit): it takes
    # a node at 50 s, ours needs both: 50 + its run
    state = QueueState(T0, 2, (running("7", 2, 600, 10), pending("8", 1, 60)), "batch")
    starts = queue_state.start_range(state, ["7"], 2, T0 + 50)
    assert starts == {"low": T0 + 56, "central": T0 + 80, "high": T0 + 110}
    # alone on the partition: at once
    alone = QueueState(T0, 2, (running("7", 2, 600, 10),), "batch")
    assert queue_state.start_range(alone, ["7"], 2, T0 + 50) == dict.fromkeys(
        ("low", "central", "high"), T0 + 50
    )
    # eligible already (a pending job of ours): from the reading on
    assert queue_state.start_range(alone, ["7"], 2, T0 - 30)["central"] == T0 + 0
    assert "1 other job on batch's 2 nodes (0 running, 1 pending" in queue_state.describe(
        state, ["7"]
    )


def test_the_next_job_waits_by_the_queue_and_later_ones_by_it_and_the_measured_waits():
    """Segment 3 of 4 runs on 2 of 3 nodes (ends at T0 + 100 at the central rate, 70 at
    the low, 130 at the high); another user's job of 1 min limit holds the third node,
    another waits for two: segment 4's job waits for them, where no measured wait (0 s
    each) foretold it."""
    exp = {"segments": 4, "iterations_per_segment": 100}
    recs = [
        {
            "segment": k, "segments": 4, "resumed_from_iteration": 100 * (k - 1),
            "last_iteration": 100 * k,
            "timing": {"job": {"submitted": T0 - 600 + 200 * (k - 1),
                               "started": T0 - 600 + 200 * (k - 1)},
                       "ended": T0 - 600 + 200 * (k - 1) + 100, "seconds_per_iteration": 0.5},
        }
        for k in (1, 2)
    ]  # fmt: skip
    queue = QueueState(
        T0,
        3,
        (running("50", 2, 120, 0), running("60", 1, 60, 0), pending("61", 2, 60)),
        "batch",
    )
    kwargs = dict(running_since=T0, running_logged=200, running_segment=3,
                  running_start_iteration=200)  # fmt: skip
    plain = calendar.campaign_forecast(exp, recs, 200, T0, **kwargs)
    f = calendar.campaign_forecast(exp, recs, 200, T0, queue=queue, mine=["50"], nodes=2, **kwargs)
    assert plain.wait.seconds == 0 and plain.finish == T0 + 100 + 100
    # job 61 takes two nodes when ours frees them (at 100 s central, 70 low, 130 high)
    # and runs half its limit (30 s), a tenth (6 s) or all of it (60 s): ours waits that
    assert f.queue_wait == pytest.approx((30, 6, 60))
    assert f.segment_ends[1] == pytest.approx(T0 + 100 + 30 + 100)
    # the interval per part: the wait alone at its ends (60 s: 30 s later, 6 s: 24 s
    # earlier), within every part at its end at once
    assert f.finish + 30 <= f.high < T0 + 130 + 60 + 100
    assert T0 + 70 + 6 + 70 < f.low <= f.finish - 24
    line = calendar.describe(f)
    assert "queue: the next job waits 30 s (6 s to 60 s) by the queue now: 2 other jobs" in line
    # a forecast from the queue does not move when only the clock does (a running job
    # that has not ended is news: only pending ones here)
    finishes = set()
    for dt in (0, 20, 40):
        q = QueueState(T0 + dt, 3, (running("50", 2, 120, dt), pending("61", 2, 60)), "batch")
        g = calendar.campaign_forecast(
            exp, recs, 200, T0 + dt, queue=q, mine=["50"], nodes=2, **kwargs
        )
        finishes.add((round(g.finish, 6), round(g.low, 6), round(g.high, 6)))
    assert len(finishes) == 1, finishes


def test_the_measured_waits_and_the_queue_now_make_the_later_jobs_wait():
    measured = calendar.Wait(0.0, 0.0, 10.0, "measured over 3 jobs", 3)
    w = calendar.with_queue(measured, {"low": 4.0, "central": 40.0, "high": 80.0})
    # the longer of the queue's and the measured median; the range from both
    assert (w.seconds, w.low, w.high) == (40.0, 0.0, 80.0)
    busy = calendar.Wait(60.0, 30.0, 90.0, "measured over 3 jobs", 3)
    assert calendar.with_queue(busy, {"low": 0.0, "central": 0.0, "high": 0.0}).seconds == 60
    assert w.source == "measured over 3 jobs and the queue now"
    unknown = calendar.Wait(None, None, None, "unknown, not included")
    assert calendar.with_queue(unknown, {"low": 4.0, "central": 40.0, "high": 80.0}) == (
        calendar.Wait(40.0, 4.0, 80.0, "from the queue now", 1)
    )
    assert calendar.with_queue(measured, None) is measured


def test_pending_jobs_of_lower_priority_than_our_next_job_are_behind_it():
    """priority/basic (the test cluster's): by submission. Our next job (71, pending for
    its dependency since our running job 70 started) was submitted before job 80: once
    70 ends it goes first; job 65, submitted before it, goes before it."""
    rows = "70|RUNNING|2|10:00|1:00|4294901690\n71|PENDING|2|10:00|0:00|4294901689\n"
    later = rows + "80|PENDING|2|1:00|0:00|4294901680\n"
    earlier = rows + "65|PENDING|2|1:00|0:00|4294901695\n"
    for text, wait in ((later, 0), (earlier, 60)):
        state = QueueState(T0, 2, tuple(queue_state.parse_jobs(text)), "batch")
        starts = queue_state.start_range(state, ["70", "71"], 2, T0 + 540)
        assert starts["high"] == T0 + 540 + wait
    state = QueueState(T0, 2, tuple(queue_state.parse_jobs(later)), "batch")
    assert "(0 running, 1 pending, 1 of them behind ours;" in queue_state.describe(
        state, ["70", "71"]
    )
    # without our job pending (not submitted yet) every pending job is ahead
    alone = "70|RUNNING|2|10:00|1:00|4294901690\n80|PENDING|2|1:00|0:00|4294901680\n"
    state = QueueState(T0, 2, tuple(queue_state.parse_jobs(alone)), "batch")
    assert queue_state.start_range(state, ["70"], 2, T0 + 540)["high"] == T0 + 600
