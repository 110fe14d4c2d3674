"""The segment's hang watchdog, unit by unit: its bound (floor, ceiling, from the measured
times, the ceiling before anything was measured), its decision on heartbeats and log lines
written here on a clock the test turns (a slow but progressing segment is never ended; a
frozen rank is named, first first), the class ``hang`` (retried), and the launch it ends
(SIGTERM, then SIGKILL). A real two-rank torch segment with a frozen rank:
test_watchdog_segment.py."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest
from support import REPO, hang_guard

from hpcllm.clusters import ClusterError, WatchdogFacts, load_cluster
from hpcllm.failures.classify import classify_text, is_transient
from hpcllm.training.campaign import attempts, watchdog
from hpcllm.training.campaign.engine_process import run_launch
from hpcllm.training.engines.heartbeat import Heartbeat, heartbeat_file, read_heartbeats

FACTS = WatchdogFacts(floor_seconds=900, ceiling_seconds=3600, heartbeat_seconds=10)


def record(save: Path, segment: int, **measured) -> None:
    (save / "chain").mkdir(parents=True, exist_ok=True)
    (save / "chain" / f"seg{segment}.json").write_text(json.dumps({"segment": segment, **measured}))


def test_the_bound_is_the_ceiling_before_anything_is_measured(tmp_path):
    assert watchdog.measured_times(tmp_path) is None
    b = watchdog.bounds(FACTS, None, heartbeats=True)
    assert (b.start, b.step, b.save) == (3600, 3600, 3600)
    assert "the ceiling, as nothing was measured yet" in b.describe("step")
    # an iteration measured but no save yet: the first save still gets the ceiling
    b = watchdog.bounds(FACTS, {"segment": 1, "iteration_seconds": 300.0}, heartbeats=True)
    assert (b.start, b.step, b.save) == (3600, 1200, 3600)
    assert b.of("data") == b.of("sync") == b.of("eval") == 1200
    assert "4 x an iteration of 300 s measured in segment 1" in b.describe("step")


def test_the_bound_follows_the_measured_times_within_floor_and_ceiling(tmp_path):
    record(tmp_path, 1, iteration_seconds=2.0, save_seconds=30.0)
    record(tmp_path, 2, iteration_seconds=400.0, save_seconds=2000.0)
    record(tmp_path, 3, lm_loss=1.0)  # trained nothing it measured: not the newest measured
    found = watchdog.measured_times(tmp_path)
    assert found["segment"] == 2
    b = watchdog.bounds(FACTS, found, heartbeats=True)
    assert (b.step, b.save) == (1600, 3600)  # 4 x 400; 4 x 2000 capped at the ceiling
    fast = watchdog.bounds(FACTS, {"segment": 1, "iteration_seconds": 2.0, "save_seconds": 30.0},
                           heartbeats=True)  # fmt: skip
    assert (fast.step, fast.save) == (900, 900)  # 8 s and 120 s: the floor
    # From Megatron-LM's log alone progress shows every log_interval iterations, and an
    # evaluation of eval_iters batches prints nothing until it ends.
    megatron = watchdog.bounds(
        FACTS, {"segment": 1, "iteration_seconds": 10.0}, heartbeats=False,
        log_interval=20, eval_iters=50,
    )  # fmt: skip
    assert megatron.step == 2800 and "70 iterations" in megatron.describe("step")
    # The torch engine's heartbeats show each iteration; where none is written any more,
    # the log's bound holds (log_interval iterations and an evaluation)
    torch = watchdog.bounds(FACTS, found, heartbeats=True, log_interval=2, eval_iters=1)
    assert (torch.step, torch.step_log) == (1600, 3600)
    assert torch.of("step", heartbeats=False) == 3600 and torch.of("save", False) == 3600
    assert "3 iterations" in torch.describe("sync", heartbeats=False)


def test_the_cluster_facts_carry_the_watchdog(tmp_path):
    juwels = load_cluster("juwels", REPO / "config/clusters", environ={"HPCLLM_ACCOUNT": "p"})
    assert juwels.watchdog == WatchdogFacts()  # the defaults
    assert WatchdogFacts().floor_seconds > 600  # above NCCL's 10-minute time-out
    text = (REPO / "config/clusters/local.yaml").read_text()
    (tmp_path / "w.yaml").write_text(text + "watchdog: {floor_seconds: 60, ceiling_seconds: 120}\n")
    assert load_cluster("w", tmp_path).watchdog == WatchdogFacts(60, 120, 10)
    lines = len(text.splitlines())
    (tmp_path / "x.yaml").write_text(text + "watchdog: {floor_seconds: 600, ceiling_seconds: 60}\n")
    with pytest.raises(ClusterError, match=rf"x.yaml:{lines + 1}: watchdog.floor_seconds \(600\)"):
        load_cluster("x", tmp_path)
    (tmp_path / "z.yaml").write_text(text + "watchdog: {floor_seconds: 30}\n")
    with pytest.raises(ClusterError, match=r"must be above 3 x watchdog.heartbeat_seconds \(10\)"):
        load_cluster("z", tmp_path)
    (tmp_path / "y.yaml").write_text(text + "watchdog: {floor: 60}\n")
    with pytest.raises(ClusterError, match="watchdog: Additional properties"):
        load_cluster("y", tmp_path)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def beat(folder: Path, rank: int, phase: str, iteration: int, progress: int, at: float) -> None:
    heartbeat_file(folder, rank).write_text(json.dumps({
        "rank": rank, "host": f"node{rank}", "pid": 100 + rank, "phase": phase,
        "iteration": iteration, "progress": progress, "since": at, "time": at,
    }))  # fmt: skip


STEP = watchdog.Bounds(start=100, step=20, save=60, step_log=50)
LOG_ONLY = watchdog.Bounds(start=100, step=20, save=60)  # an engine without heartbeats


def dog(tmp_path: Path, clock: Clock, ranks: int = 2, heartbeats: bool = True):
    log = tmp_path / "seg1.engine.log"
    log.touch()
    folder = watchdog.fresh_heartbeat_dir(log) if heartbeats else None
    limits = STEP if heartbeats else LOG_ONLY
    return watchdog.Watchdog(limits, log, folder, ranks, heartbeat_seconds=2, clock=clock), log


def test_a_slow_but_progressing_segment_is_never_ended(tmp_path):
    """Each step takes just under the bound, for fifty times the bound: never a stall."""
    clock = Clock()
    w, _ = dog(tmp_path, clock)
    for n in range(1, 51):
        for rank in (0, 1):
            beat(w.heartbeat_dir, rank, "step", n, n, clock.now)
        assert w.check() is None
        clock.now += 19.5
        assert w.check() is None
    # a long save after it: its own bound, not the step's
    for rank in (0, 1):
        beat(w.heartbeat_dir, rank, "save", 50, 51, clock.now)
    assert w.check() is None
    clock.now += 59
    assert w.check() is None and w.stall is None


def test_without_heartbeats_written_the_log_bound_holds(tmp_path):
    """A file system that refuses the heartbeat files (an inode quota) while the training
    goes on, logging every few iterations: the log's bound, not the heartbeats'."""
    clock = Clock()
    w, log = dog(tmp_path, clock)
    for rank in (0, 1):
        beat(w.heartbeat_dir, rank, "step", 1, 1, clock.now)
    assert w.check() is None
    for n in range(2, 12):
        clock.now += 45  # beyond the heartbeats' 20 s, within the log's 50 s
        with open(log, "a") as f:
            f.write(MEGATRON_ITERATION.format(n=n, s=n))
        assert w.check() is None, n
    clock.now += 51
    stall = w.check()
    assert stall is not None and stall.bound_seconds == 50
    assert [r["rank"] for r in stall.stopped] == [0, 1]


def test_the_start_up_gets_the_generous_bound(tmp_path):
    clock = Clock()
    w, log = dog(tmp_path, clock)
    beat(w.heartbeat_dir, 0, "start", 0, 0, clock.now)
    assert w.check() is None and w.phase() == "start"
    clock.now += 90  # beyond the step's 20 s, within the start's 100 s
    assert w.check() is None
    with open(log, "a") as f:
        f.write("> building indices\n")  # any output of the start-up is progress
    assert w.check() is None
    clock.now += 99
    assert w.check() is None
    clock.now += 2
    stall = w.check()
    assert stall is not None and stall.phase == "start" and stall.bound_seconds == 100
    # rank 1 never wrote a heartbeat: named, after rank 0 (silent for 191 s)
    assert [r["rank"] for r in stall.stopped] == [0, 1]
    assert "rank 1 (never reported)" in stall.describe()


def test_a_frozen_rank_is_named_first_and_the_waiting_one_as_alive(tmp_path):
    clock = Clock()
    w, _ = dog(tmp_path, clock, ranks=3)
    for n in range(1, 4):
        for rank in (0, 1, 2):
            beat(w.heartbeat_dir, rank, "step", n, n, clock.now)
        w.check()
        clock.now += 1
    # rank 1 freezes in its step 4; rank 2 dies a little later in sync; rank 0 reaches
    # the sync and waits there, its heartbeat thread still writing (time moves, no progress)
    beat(w.heartbeat_dir, 1, "step", 4, 4, clock.now)
    beat(w.heartbeat_dir, 2, "sync", 3, 4, clock.now)
    beat(w.heartbeat_dir, 0, "sync", 3, 4, clock.now)
    w.check()
    frozen_at = clock.now
    for second in range(1, 30):
        clock.now = frozen_at + second
        if second < 4:  # rank 2 still beats for a few seconds before its node goes
            beat(w.heartbeat_dir, 2, "sync", 3, 4, clock.now - 0.5)
        beat(w.heartbeat_dir, 0, "sync", 3, 4, clock.now - 0.5)  # alive, waiting
        stall = w.check()
        if stall is not None:
            break
    assert second == 21  # the first check with more than the step's 20 s without progress
    assert stall is not None and stall.phase == "step" and stall.bound_seconds == 20
    assert [r["rank"] for r in stall.stopped] == [1, 2]  # longest silent first
    assert stall.stopped[0]["silent_seconds"] == 21 and stall.stopped[0]["host"] == "node1"
    assert [r["rank"] for r in stall.waiting] == [0]
    text = stall.describe()
    assert "rank 1 on node1 (pid 101, in 'step' at iteration 4, silent for 21 s) stopped " \
        "reporting first" in text, text  # fmt: skip
    assert "alive but waiting: rank 0 on node0 (pid 100, in 'sync' at iteration 3)" in text
    assert stall.as_record()["stopped"][0]["rank"] == 1


def test_a_rank_stuck_alive_is_named_as_the_first_without_progress(tmp_path):
    """Rank 0 stuck in its save (its heartbeat thread runs on), rank 1 past it, waiting
    in the next step for it: every rank alive, rank 0 named first."""
    clock = Clock()
    w, _ = dog(tmp_path, clock)
    beat(w.heartbeat_dir, 0, "step", 5, 10, clock.now)
    beat(w.heartbeat_dir, 1, "step", 5, 10, clock.now)
    w.check()
    clock.now += 1
    beat(w.heartbeat_dir, 0, "save", 5, 11, clock.now)
    beat(w.heartbeat_dir, 1, "save", 5, 11, clock.now)
    w.check()
    clock.now += 1
    beat(w.heartbeat_dir, 1, "data", 6, 12, clock.now)  # rank 1's part of the save is done
    w.check()
    start = clock.now
    while (stall := w.check()) is None:
        clock.now += 1
        for rank, phase, iteration, progress in ((0, "save", 5, 11), (1, "data", 6, 12)):
            beat(w.heartbeat_dir, rank, phase, iteration, progress, clock.now)  # alive
        assert clock.now - start < 100
    assert stall.bound_seconds == 60  # the save's bound: a rank is in its save
    assert stall.stopped == [] and [r["rank"] for r in stall.waiting] == [0, 1]
    assert "every rank alive; rank 0 on node0 (pid 100, in 'save' at iteration 5) made no " \
        "progress first; then waiting: rank 1" in stall.describe()  # fmt: skip


MEGATRON_ITERATION = (
    " [2026-11-28 10:00:00] iteration {n:8d}/     100 | consumed samples: {s:12d} | "
    "elapsed time per iteration (ms): 9000.0 | lm loss: 1.0E+00 |\n"
)


def test_megatron_progress_is_read_from_its_log(tmp_path):
    clock = Clock()
    w, log = dog(tmp_path, clock, heartbeats=False)
    with open(log, "a") as f:
        f.write("> compiling dataset index builder ...\n")
    assert w.check() is None and w.phase() == "start"
    for n in range(1, 6):
        clock.now += 19
        with open(log, "a") as f:
            f.write(MEGATRON_ITERATION.format(n=n, s=n * 8))
            f.write("some warning printed by a rank\n")  # not progress once training
        assert w.check() is None and w.phase() == "step"
    with open(log, "a") as f:
        f.write(" [2026-11-28 10:01:00] saving checkpoint at iteration       5 to ckpt in "
                "torch_dist format\n")  # fmt: skip
    clock.now += 50
    assert w.check() is None and w.phase() == "save"  # the save's 60 s
    with open(log, "a") as f:
        f.write("  successfully saved checkpoint from iteration       5 to ckpt [ t 1/1 ]\n")
    assert w.check() is None and w.phase() == "step"
    clock.now += 15
    with open(log, "a") as f:
        f.write("a warning, no iteration\n")
    assert w.check() is None
    clock.now += 6  # 21 s since the save's end
    stall = w.check()
    assert stall is not None and stall.stopped == [] and stall.waiting == []
    assert "which rank hung is not known" in stall.describe()


def test_the_hang_is_classified_and_retried(tmp_path):
    text = (
        "[rank0]: iteration        3/     200 | lm loss: 1.0E+00 |\n"
        "==> 2026-11-28 14:00:00 hpcllm watchdog: hang: no progress for 21 s ...\n"
        "[2026-11-28 14:00:01] torch.distributed.elastic.multiprocessing.api: Received "
        "Signals.SIGTERM death signal, shutting down workers\n"
        "exitcode  : -9 (pid: 123)\n"
    )
    assert classify_text(text) == "hang"
    assert is_transient("hang")
    # an attempt that hung without progress does not stop the chain
    path = tmp_path / "seg1.attempts.json"
    entry = attempts.record_start(path, 1, 10, environ={}, deadline=time.time() + 3600)
    attempts.record_end(path, entry, 10, "hang", "hung", logged=None, hang={"phase": "step"})
    assert attempts.load(path)[0].hang == {"phase": "step"}
    assert attempts.refusal(attempts.load(path), 2, 10, state_of=lambda job: None) is None
    # ... also where the watchdog ended it close to its job's time limit
    late = tmp_path / "late.attempts.json"
    entry = attempts.record_start(late, 1, 10, environ={"SLURM_JOB_ID": "7"},
                                  deadline=time.time() + 30, time_lead=60)  # fmt: skip
    attempts.record_end(late, entry, 10, "hang", "hung", logged=None)
    assert attempts.refusal(attempts.load(late), 2, 10, state_of=lambda job: None) is None
    entry.failure = "signal"  # the same attempt stopped for time: refused
    attempts._save(late, [entry])
    assert "ran until its time limit" in attempts.refusal(
        attempts.load(late), 2, 10, state_of=lambda job: None
    )


def test_heartbeats_are_written_and_refreshed(tmp_path):
    hb = Heartbeat(tmp_path, rank=3, every=0.1).start()
    try:
        first = read_heartbeats(tmp_path)[3]
        assert (first["phase"], first["progress"]) == ("start", 0)
        hb.progress("start", 0, doing="model")
        hb.progress("step", 7)
        now = read_heartbeats(tmp_path)[3]
        assert (now["phase"], now["iteration"], now["progress"]) == ("step", 7, 2)
        assert "doing" not in now  # a phase's details go with it
        deadline = time.time() + hang_guard(5)
        while read_heartbeats(tmp_path)[3]["time"] == now["time"]:  # the thread rewrites
            assert time.time() < deadline
            time.sleep(0.05)
        assert read_heartbeats(tmp_path)[3]["progress"] == 2
    finally:
        hb.stop()
    assert not list(tmp_path.glob("*.tmp"))
    Heartbeat(None, 0).start().progress("step", 1)  # no folder: no watchdog, nothing
    # in a Slurm step the node as Slurm names it (--exclude takes it), else the host
    env = {"HPCLLM_HEARTBEAT_DIR": str(tmp_path / "s"), "SLURMD_NODENAME": "n2"}
    assert Heartbeat.from_environment(1, env).state["host"] == "n2"
    assert Heartbeat.from_environment(1, {}).path is None


def test_the_watchdog_ends_a_launch_that_ignores_sigterm(tmp_path):
    """The engines' exit signal is pointless for a hung rank: SIGTERM, then SIGKILL."""
    script = tmp_path / "launch.sh"
    log = tmp_path / "engine.log"
    child = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open('{tmp_path}/pid', 'w').write(str(os.getpid())); time.sleep(600)"
    )
    calls = []

    def stalled():
        calls.append(time.monotonic())
        return "stall" if len(calls) >= 2 else None

    started = time.monotonic()
    rc = run_launch(
        f"trap '' TERM\n{sys.executable} -c \"{child}\"\n", script, log, {},
        poll_s=0.2, watchdog=stalled, kill_wait=1.0,
    )  # fmt: skip
    assert rc in (-signal.SIGKILL, 128 + signal.SIGKILL)
    assert time.monotonic() - started < hang_guard(10)
    pid = int((tmp_path / "pid").read_text())
    deadline = time.time() + hang_guard(5)
    while Path(f"/proc/{pid}").exists() and "Z" not in _state(pid):  # gone, or a zombie
        assert time.time() < deadline, f"process {pid} outlived the launch"
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def status_after_hang(work: Path, hang: dict) -> str:
    """`hpcllm status` of tiny_local (1 of 3 segments done) whose segment 2 attempt ended
    as ``hang``."""
    from test_status import attempts as write_attempts
    from test_status import campaign

    from hpcllm.training.campaign import status

    campaign(work, reached=12, segments_done=1)
    now = time.time()
    write_attempts(work, [
        {"attempt": 1, "job_id": "79", "host": "n1", "start_iteration": 10,
         "started": now - 3600, "reached_iteration": 12, "failure": "hang",
         "ended": now - 1800, "hang": hang},
    ])  # fmt: skip
    return status.campaign_status(work, profile="profiles/local", jobs=[])


def test_status_names_the_rank_that_stopped_first(tmp_path):
    hang = {"quiet_seconds": 930.0, "bound_seconds": 900, "phase": "step", "waiting": [],
            "stopped": [{"rank": 5, "host": "n3", "pid": 4242, "phase": "save",
                         "iteration": 12, "silent_seconds": 931.0}]}  # fmt: skip
    out = status_after_hang(tmp_path, hang)
    assert (
        "last failure: hang (job 79): rank 5 on n3 stopped reporting first, in 'save' at "
        "iteration 12" in out
    ), out


def test_a_retry_avoids_the_node_that_stopped_reporting_first(tmp_path):
    """The node of each earlier hang of this run (its first silent rank), for the retry's
    --exclude (the train_segment rule's slurm_extra) and its attempt's record."""

    def hung(attempt: int, *hosts: str, failure: str = "hang") -> attempts.Attempt:
        stopped = [{"rank": i, "host": h, "phase": "step", "iteration": 3} for i, h in
                   enumerate(hosts)]  # fmt: skip
        return attempts.Attempt(attempt, str(attempt), "b", 0, float(attempt), 0, failure,
                                hang={"stopped": stopped} if failure == "hang" else None)  # fmt: skip

    earlier_run = [hung(1, "n9")]  # a run before this one: its attempts start at 1 again
    entries = [*earlier_run, hung(1, "n2", "n1"), hung(2, "n3"), hung(3, "n2")]
    assert attempts.suspect_nodes(entries, 2) == ["n2"]
    assert attempts.suspect_nodes(entries, 4) == ["n2", "n3"]
    assert attempts.suspect_nodes(entries, 1) == []
    assert attempts.suspect_nodes([hung(1, failure="node_failure")], 2) == []
    assert attempts.suspect_nodes([hung(1)], 2) == []  # no rank named: no node suspect
    # what the job's slurm_extra asked for is what its attempt records
    extra = "--ntasks-per-node=1 --signal=USR2@30 --exclude=n2,n3"
    assert attempts.excluded_nodes(extra) == ["n2", "n3"]
    assert attempts.excluded_nodes("--signal=USR2@30") == attempts.excluded_nodes("") == []
    path = tmp_path / "seg2.attempts.json"
    attempts.record_start(path, 2, 40, environ={"SLURM_JOB_ID": "9"}, excluded=["n2"])
    assert attempts.load(path)[0].excluded == ["n2"]


def test_where_every_rank_was_alive_the_one_that_made_no_progress_first_is_suspect(tmp_path):
    """A rank stuck in its save or data loading keeps writing its heartbeat (alive), the
    others wait for it: the watchdog names it first among the waiting, the retry avoids
    its node, and status says what it was doing."""
    hang = {"quiet_seconds": 20.0, "bound_seconds": 15, "phase": "save", "stopped": [],
            "waiting": [{"rank": 1, "host": "n2", "pid": 7, "phase": "save", "iteration": 50},
                        {"rank": 0, "host": "n1", "pid": 8, "phase": "step",
                         "iteration": 51}]}  # fmt: skip
    entry = attempts.Attempt(1, "79", "n1", 40, 1.0, 40, "hang", hang=hang)
    assert attempts.suspect(hang) == {**hang["waiting"][0], "stopped": False}
    assert attempts.suspect_nodes([entry], 2) == ["n2"]
    # one that stopped reporting outranks the waiting ones
    frozen = {**hang, "stopped": [{"rank": 0, "host": "n1", "pid": 8, "phase": "step",
                                   "iteration": 51, "silent_seconds": 9.0}]}  # fmt: skip
    assert attempts.suspect_nodes([attempts.Attempt(1, "79", "n1", 40, 1.0, 40, "hang",
                                                    hang=frozen)], 2) == ["n1"]  # fmt: skip
    out = status_after_hang(tmp_path, hang)
    assert (
        "last failure: hang (job 79): rank 1 on n2 made no progress first, in 'save' at "
        "iteration 50 (every rank alive, the others waiting for it)" in out
    ), out


def test_of_ranks_seen_progressing_in_one_poll_the_one_behind_is_named_first(tmp_path):
    """Rank 1 blocks in its save before the barrier; rank 0 reaches the barrier (one more
    phase change) within the same poll: both alive, rank 1 named first, not by its number."""
    clock = Clock()
    w, _ = dog(tmp_path, clock)
    for rank in (0, 1):
        beat(w.heartbeat_dir, rank, "step", 5, 10, clock.now)
    w.check()
    clock.now += 1
    beat(w.heartbeat_dir, 1, "save", 5, 11, clock.now)  # stuck in it
    beat(w.heartbeat_dir, 0, "save", 5, 12, clock.now)  # past its write, at the barrier
    w.check()
    while (stall := w.check()) is None:
        clock.now += 1
        for rank, progress in ((0, 12), (1, 11)):  # the heartbeat threads run on
            beat(w.heartbeat_dir, rank, "save", 5, progress, clock.now)
    assert stall.bound_seconds == 60 and stall.stopped == []
    assert [r["rank"] for r in stall.waiting] == [1, 0]


def test_a_slow_save_while_the_heartbeat_thread_writes_on_is_not_ended(tmp_path):
    """A save within its bound (60 s here: 4 x a measured save) whose heartbeat files are
    rewritten every 2 s without progress (the thread runs on) is never ended; past the
    bound it is."""
    clock = Clock()
    w, _ = dog(tmp_path, clock)
    for rank in (0, 1):
        beat(w.heartbeat_dir, rank, "save", 8, 20, clock.now)
    assert w.check() is None
    for _ in range(29):  # 58 s of a save, both ranks alive
        clock.now += 2
        for rank in (0, 1):
            beat(w.heartbeat_dir, rank, "save", 8, 20, clock.now)
        assert w.check() is None
    for rank in (0, 1):  # the save done: the next iteration
        beat(w.heartbeat_dir, rank, "data", 9, 21, clock.now)
    assert w.check() is None
    clock.now += 19
    assert w.check() is None and w.stall is None


def test_the_test_fault_hook_is_inert_unless_set_and_refuses_a_bad_value():
    from hpcllm.training.engines.fault_injection import FAULT_ENV, Fault, inject

    assert Fault.from_environment({}) is None
    inject(None, "data", 0, 5)  # returns: no fault
    fault = Fault.from_environment({FAULT_ENV: "slow:1:3:1.0"})
    assert fault == Fault("slow", 1, 3, 1.0)
    started = time.monotonic()
    inject(fault, "slow", 0, 9)  # another rank
    inject(fault, "slow", 1, 3)  # not past 3
    assert time.monotonic() - started < 0.5  # neither slept its second
    inject(fault, "slow", 1, 4)
    assert time.monotonic() - started >= 1.0
    with pytest.raises(ValueError, match=f"{FAULT_ENV}='hang:1': expected save:<rank>"):
        Fault.from_environment({FAULT_ENV: "hang:1"})


def test_a_test_fault_bound_to_a_node_hits_every_rank_there_and_none_elsewhere():
    """As a faulty node: the ranks on it meet the fault whatever their number, and the
    next job that excludes the node meets none (tests/slurm/test_hangs.py)."""
    from hpcllm.training.engines.fault_injection import FAULT_ENV, Fault, inject

    on_n2 = Fault.from_environment({FAULT_ENV: "slow:n2:3:1.0", "SLURMD_NODENAME": "n2"})
    assert (on_n2.rank, on_n2.node, on_n2.here) == (None, "n2", "n2")
    assert on_n2.hits(0) and on_n2.hits(1)
    elsewhere = Fault.from_environment({FAULT_ENV: "slow:n2:3:1.0", "SLURMD_NODENAME": "n3"})
    assert not elsewhere.hits(0) and not elsewhere.hits(1)
    outside_slurm = Fault.from_environment({FAULT_ENV: "save:n2:3"})
    assert not outside_slurm.hits(0)
    started = time.monotonic()
    inject(elsewhere, "slow", 1, 9)
    assert time.monotonic() - started < 0.5
    inject(on_n2, "slow", 0, 4)
    assert time.monotonic() - started >= 1.0
