"""Retries of a segment (which attempt may run), the checkpoint folder's lease, and the
segment's time arithmetic."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from support import hang_guard

from hpcllm.failures.classify import classify_text, is_transient
from hpcllm.models.megatron_args import MegatronArgsError
from hpcllm.training.campaign import attempts
from hpcllm.training.campaign.segment import (
    exit_duration,
    parse_slurm_time,
    remaining_job_seconds,
    segment_failure,
    warn_early_signal,
)
from hpcllm.training.checkpoints import lease

# ---------------------------------------------------------------- failure classes


@pytest.mark.parametrize(
    ("text", "signum", "expected"),
    [
        ("exiting at iteration 7 (time) before 100", None, "time_limit"),
        ("exiting at iteration 7 (signal) before 100", 15, "signal"),
        # Megatron-LM's own lines for the same two stops
        ("exiting program after 5.0 minutes", None, "time_limit"),
        ("exiting program at iteration 700", None, "signal"),
        # Megatron-LM's --exit-signal-handler stop (its text for any --exit-signal); Slurm's
        # --signal reaches the steps, not the segment (signum None)
        ("[2026-11-26 23:00:00] exiting program after receiving SIGTERM.", None, "signal"),
        ("slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT 2026 DUE TO TIME LIMIT ***", 15, "time_limit"),
        ("srun: error: Node failure on n2", None, "node_failure"),
        # the signal that reached the survivors of a node failure does not hide it
        ("srun: error: Node failure on n2", 15, "node_failure"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", None, "out_of_memory"),
        ("FileNotFoundError: [Errno 2] No such file or directory: 'x.idx'", None, "missing_file"),
        # a save on a full file system: the errno, and torch.save's zip writer
        ("OSError: [Errno 28] No space left on device: 'ckpt/iter_45'", None, "disk_full"),
        ("RuntimeError: [enforce fail at inline_container.cc:626] . unexpected pos 1536 vs 1484",
         None, "disk_full"),
        ("AssertionError: num_layers must be divisible by pipeline size", None, "config_error"),
        ("Traceback (most recent call last):\n  boom", None, "error"),
        # the engine died from a forwarded signal before it could say anything
        ("torchrun: Received 15 death signal, shutting down workers", 15, "signal"),
        ("[WARNING] Received Signals.SIGTERM death signal, shutting down workers", None, "signal"),
        ("slurmstepd: error: *** STEP 7.0 ON n1 CANCELLED AT 2026-11-26T20:01:39 ***", None, "cancelled"),
        ("slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-11-26T20:01:39 ***", None, "cancelled"),
        # one node's engine refused its options; srun then terminated the other node's
        # task, whose torchrun logs the signal (the 2-node canary on a slow machine)
        (
            "pretrain_gpt.py: error: unrecognized arguments: --exit-signal-handler\n"
            "srun: error: n1: task 0: Exited with exit code 1\n"
            "srun: launch/slurm: _step_signal: Terminating StepId=4014.0\n"
            "[WARNING] Received 15 death signal, shutting down workers\n"
            "slurmstepd: error: *** STEP 2014.0 ON n1 CANCELLED AT 2026-11-26T20:01:39 ***\n"
            "torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got signal: 15",
            None, "config_error",
        ),
        (
            "torch.distributed.DistStoreError: TCP client failed to connect to n1:29500\n"
            "[WARNING] Received 15 death signal, shutting down workers",
            None, "rendezvous_error",
        ),
        ("", 15, "signal"),
        ("", None, "error"),
    ],
)  # fmt: skip
def test_segment_failure_classes(text, signum, expected):
    assert segment_failure(text, signum) == expected


def test_transient_and_deterministic_classes():
    for failure in ("time_limit", "node_failure", "signal", "preempted", "nccl_error"):
        assert is_transient(failure), failure
    for failure in ("out_of_memory", "missing_file", "config_error", "error", "cancelled", None):
        assert not is_transient(failure), failure
    # Slurm's state names the cause where the log cannot (the batch host died)
    assert classify_text("", "NODE_FAIL") == "node_failure"
    assert classify_text("", "PREEMPTED") == "preempted"


# ------------------------------------------------------------------------ attempts


def _attempt(tmp_path, n, start, reached, failure, job="101"):
    path = tmp_path / "seg1.attempts.json"
    entry = attempts.record_start(path, n, start, environ={"SLURM_JOB_ID": job})
    if reached is not None:
        attempts.record_end(path, entry, reached, failure, f"{failure} happened")
    return path


def test_attempts_file_sits_beside_the_engine_log():
    assert attempts.attempts_path("logs/train_segment/e/seg3.engine.log").as_posix() == (
        "logs/train_segment/e/seg3.attempts.json"
    )


def test_a_transient_failure_with_progress_lets_the_next_attempt_run(tmp_path):
    path = _attempt(tmp_path, 1, 0, 40, "time_limit")
    assert attempts.refusal(attempts.load(path), 2, latest_iteration=40) is None
    # the first attempt of a run never is refused
    assert attempts.refusal(attempts.load(path), 1, latest_iteration=0) is None


def test_a_deterministic_failure_is_not_retried_and_names_class_and_job(tmp_path):
    path = _attempt(tmp_path, 1, 0, 0, "out_of_memory", job="4711")
    why = attempts.refusal(attempts.load(path), 2, latest_iteration=0)
    assert "out_of_memory" in why and "job 4711" in why and "Fix the cause" in why

    # a message that ends its own sentence (a checksum refusal's "then rerun.") is not
    # followed by a second period
    entry = attempts.record_start(tmp_path / "b.json", 1, 0, environ={"SLURM_JOB_ID": "9"})
    attempts.record_end(tmp_path / "b.json", entry, 0, "config_error", "fix it, then rerun.")
    why = attempts.refusal(attempts.load(tmp_path / "b.json"), 2, latest_iteration=0)
    assert "then rerun. Fix the cause" in why and ".." not in why, why


def test_an_attempt_without_progress_stops_the_chain(tmp_path):
    path = _attempt(tmp_path, 1, 0, 40, "time_limit")
    _attempt(tmp_path, 2, 40, 40, "time_limit", job="102")
    why = attempts.refusal(attempts.load(path), 3, latest_iteration=40)
    assert "attempt 2 (job 102" in why and "added no iteration" in why


def test_an_attempt_that_left_no_end_is_classified_from_slurm(tmp_path):
    path = _attempt(tmp_path, 1, 0, None, None, job="55")
    states = {"55": "OUT_OF_MEMORY"}
    why = attempts.refusal(attempts.load(path), 2, 10, state_of=states.get)
    assert "out_of_memory" in why
    # a job Slurm forgot (its batch host died): transient, and it made progress
    assert attempts.refusal(attempts.load(path), 2, 10, state_of=lambda job: None) is None
    # without progress: a node failure cut it short, a time limit did not
    assert attempts.refusal(attempts.load(path), 2, 0, state_of=lambda job: "NODE_FAIL") is None
    assert "ran until its time limit and added no iteration" in attempts.refusal(
        attempts.load(path), 2, 0, state_of=lambda job: "TIMEOUT"
    )


def test_an_attempt_that_left_no_end_counts_the_iterations_of_its_log(tmp_path):
    """Its host died with it (no end record): what it trained is read from its part of the
    engine log, lines of earlier attempts and a cut last line left out."""
    log = tmp_path / "seg1.engine.log"
    line = " iteration {:8d}/     100 | lm loss: 7.0E+00 |\n"
    log.write_text(line.format(20))
    path = tmp_path / "seg1.attempts.json"
    attempts.record_start(
        path, 1, 20, environ={"SLURM_JOB_ID": "9"}, log_offset=len(log.read_text())
    )
    entries = attempts.load(path)
    assert "added no iteration" in attempts.refusal(entries, 2, 20, lambda j: None, log)
    log.write_text(log.read_text() + line.format(21) + " iteration       22/     1")
    assert attempts.refusal(entries, 2, 20, state_of=lambda j: None, engine_log=log) is None


def test_a_job_a_user_cancelled_is_not_retried_a_preempted_one_is(tmp_path):
    """The job recorded "signal" (it caught the SIGTERM); Slurm's state says whose."""
    path = _attempt(tmp_path, 1, 0, 12, "signal", job="77")
    why = attempts.refusal(attempts.load(path), 2, 12, state_of=lambda job: "CANCELLED")
    assert "failed with cancelled" in why and "job 77" in why
    assert attempts.refusal(attempts.load(path), 2, 12, state_of=lambda job: "PREEMPTED") is None
    assert attempts.refusal(attempts.load(path), 2, 12, state_of=lambda job: "FAILED") is None
    # no progress: a preemption cut it short, which says nothing about the next attempt
    assert attempts.refusal(attempts.load(path), 2, 0, state_of=lambda job: "PREEMPTED") is None


def _timed_attempt(tmp_path, ran_for, failure="signal", end=True):
    """Attempt 1 of a job with an hour to run that trained nothing in ``ran_for`` seconds
    (the margin and Slurm's signal lead: 600 s); ``end``: whether it recorded its end."""
    path = tmp_path / "seg2.attempts.json"
    entry = attempts.record_start(
        path, 1, 12, environ={"SLURM_JOB_ID": "301"}, deadline=time.time() + 3600, time_lead=600
    )
    entry.started -= ran_for  # it started ran_for seconds ago, and ends now
    entry.deadline -= ran_for
    attempts._save(path, [entry])
    if end:
        attempts.record_end(path, entry, 12, failure, f"{failure} happened")
    return path


def test_an_attempt_killed_long_before_its_time_limit_gets_its_next_attempt(tmp_path):
    """Issue 40: the engine SIGKILLed from outside 44 s into the start-up of an hour's
    segment (class signal, no iteration) proves nothing about the runtime: attempt 2 runs.
    An attempt that ran into its time limit without an iteration is refused."""
    early = _timed_attempt(tmp_path / "early", 44)
    assert attempts.refusal(attempts.load(early), 2, 12, state_of=lambda job: None) is None
    late = _timed_attempt(tmp_path / "late", 3600 - 300)  # Slurm's --signal, 300 s before
    why = attempts.refusal(attempts.load(late), 2, 12, state_of=lambda job: None)
    assert "(job 301, signal) ran until its time limit and added no iteration" in why
    assert "longer runtime" in why
    # the engine's own stop for time is refused whenever it came
    timed = _timed_attempt(tmp_path / "timed", 44, failure="time_limit")
    assert "ran until" in attempts.refusal(attempts.load(timed), 2, 12, state_of=lambda j: None)


def test_an_attempt_that_died_with_its_host_ended_when_it_last_renewed_its_lease(tmp_path):
    """No end recorded and Slurm has forgotten the job: when it died is the last renewal of
    the lease it left in the checkpoint folder."""
    save = tmp_path / "ckpt"
    save.mkdir()
    path = _timed_attempt(tmp_path, 44, end=False)
    (entry,) = attempts.load(path)
    holder = lease.Holder(entry.job_id, entry.host, 1, entry.started + 30)
    lease._write(save, holder)
    entries = attempts.load(path)
    assert attempts.refusal(entries, 2, 12, state_of=lambda j: None, save=save) is None
    lease._write(save, lease.Holder(entry.job_id, entry.host, 1, entry.deadline - 100))
    why = attempts.refusal(entries, 2, 12, state_of=lambda j: None, save=save)
    assert "ran until its time limit and added no iteration" in why
    # another job's lease tells nothing about this one: refused as before
    lease._write(save, lease.Holder("999", entry.host, 1, entry.started + 30))
    why = attempts.refusal(entries, 2, 12, state_of=lambda j: None, save=save)
    assert "was not seen cut short from outside, and added no iteration" in why


def test_a_new_snakemake_run_starts_a_new_chain_and_keeps_the_history(tmp_path):
    path = _attempt(tmp_path, 1, 0, 0, "out_of_memory")
    _attempt(tmp_path, 1, 0, 30, "time_limit")  # the user fixed it and reran
    assert attempts.refusal(attempts.load(path), 2, latest_iteration=30) is None
    assert len(attempts.load(path)) == 2


# --------------------------------------------------------------------------- lease


def test_lease_is_taken_renewed_and_released(tmp_path):
    save = tmp_path / "ckpt"
    with lease.held(save, renew_seconds=0.05) as mine:
        first = lease.read(save)
        assert first.pid == os.getpid() and first.host == socket.gethostname()
        deadline = time.time() + hang_guard(0.1)  # renewed every 0.05 s
        while lease.read(save).renewed == first.renewed:
            assert time.time() < deadline, "lease never renewed"
            time.sleep(0.02)
        assert mine.describe().startswith("process")
    assert lease.read(save) is None


def test_a_live_slurm_holder_is_refused_with_what_to_do(tmp_path):
    save = tmp_path / "ckpt"
    lease.acquire(save, lease.Holder("1234", "n1", 99, time.time()), job_live=lambda j: True)
    with pytest.raises(lease.LeaseHeld) as e:
        lease.acquire(save, lease.Holder("1240", "n2", 7, time.time()), job_live=lambda j: True)
    assert "Slurm job 1234 on n1" in str(e.value)
    assert "scancel 1234" in str(e.value) and "squeue -j 1234" in str(e.value)
    assert lease.read(save).job_id == "1234"  # the refused job wrote nothing


def test_a_stale_lease_is_taken_over(tmp_path):
    save = tmp_path / "ckpt"
    lease.acquire(save, lease.Holder("1234", "n1", 99, time.time()), job_live=lambda j: True)
    stale = lease.acquire(
        save, lease.Holder("1240", "n2", 7, time.time()), job_live=lambda j: False
    )
    assert stale.job_id == "1234" and lease.read(save).job_id == "1240"


def test_a_local_holder_is_live_while_its_process_runs(tmp_path):
    save = tmp_path / "ckpt"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lease.acquire(save, lease.Holder(None, socket.gethostname(), proc.pid, time.time()))
        with pytest.raises(lease.LeaseHeld, match=f"process {proc.pid}"):
            lease.acquire(save, lease.me(environ={}))
    finally:
        proc.kill()
        proc.wait()
    assert lease.acquire(save, lease.me(environ={})).pid == proc.pid  # gone: stale


def test_squeue_answers_liveness(tmp_path, monkeypatch):
    """Against a stand-in squeue on PATH: the states Slurm prints, and its refusal of a
    job id it forgot."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(
        '#!/bin/sh\ncase "$*" in\n'
        "  *' 1 '*) echo RUNNING;;\n"
        "  *' 2 '*) echo COMPLETED;;\n"
        "  *' 4 '*) echo PENDING;;\n"
        "  *' 5 '*) echo SUSPENDED;;\n"
        "  *' 6 '*) echo CONFIGURING;;\n"
        "  *' 7 '*) echo COMPLETING;;\n"
        "  *' 8 '*) echo FAILED;;\n"
        "  *) echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1;;\n"
        "esac\n"
    )
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert lease.slurm_job_live("1") is True
    assert lease.slurm_job_live("2") is False
    assert lease.slurm_job_live("3") is False
    # the live states the module documents: pending, suspended, configuring, completing
    # (a completing job may still write its checkpoint)
    for job in ("4", "5", "6", "7"):
        assert lease.slurm_job_live(job) is True, job
    assert lease.slurm_job_live("8") is False


def test_a_holder_seen_from_another_host_is_live_while_it_renews(tmp_path):
    """No Slurm job id and another host (no process to probe): the renewal time decides,
    and so it does for a Slurm holder when squeue cannot answer."""
    save = tmp_path / "ckpt"
    fresh = lease.Holder(None, "another-host", 1, time.time())
    lease.acquire(save, fresh)
    with pytest.raises(lease.LeaseHeld, match="process 1 on another-host"):
        lease.acquire(save, lease.me(environ={}))
    old = time.time() - lease.STALE_SECONDS - 5
    lease._write(save, lease.Holder(None, "another-host", 1, old))
    assert lease.acquire(save, lease.me(environ={})).host == "another-host"  # taken over
    lease._write(save, lease.Holder("77", "n1", 1, time.time()))
    with pytest.raises(lease.LeaseHeld, match="Slurm job 77"):
        lease.acquire(save, lease.me(environ={}), job_live=lambda j: None)
    lease._write(save, lease.Holder("77", "n1", 1, old))
    assert lease.acquire(save, lease.me(environ={}), job_live=lambda j: None).job_id == "77"


def test_release_leaves_a_lease_another_job_took_over(tmp_path):
    """A job whose lease was taken over as stale must not remove the new holder's lease
    when it ends: that would let a third writer in."""
    save = tmp_path / "ckpt"
    mine = lease.Holder("10", "n1", 1, time.time())
    lease.acquire(save, mine)
    lease.acquire(save, lease.Holder("11", "n2", 2, time.time()), job_live=lambda j: False)
    lease.release(save, mine)
    assert lease.read(save).job_id == "11"
    lease.release(save, lease.Holder("11", "n2", 2, time.time()))
    assert lease.read(save) is None


# ------------------------------------------------------------------ time arithmetic


def _experiment(engine="torch", margin=600):
    return {"engine": engine, "time": {"margin_seconds": margin}}


def test_exit_duration_leaves_the_margin():
    assert exit_duration(_experiment(), None) is None
    assert exit_duration(_experiment(margin=600), 3600) == pytest.approx(50.0)
    # Megatron takes whole minutes, rounded down so the margin is never eaten into
    assert exit_duration(_experiment("megatron", 600), 3659) == 50
    assert exit_duration(_experiment("megatron", 600), 3660) == 51
    with pytest.raises(ValueError, match="time.margin_seconds is 600"):
        exit_duration(_experiment(margin=600), 600)
    with pytest.raises(MegatronArgsError, match="plus one minute"):
        exit_duration(_experiment("megatron", 600), 650)


def test_warns_when_slurm_may_signal_before_the_engine_starts(caplog):
    experiment = {"time": {"signal_seconds": 100}}
    assert warn_early_signal(experiment, 3600) == 3600
    assert warn_early_signal(experiment, None) is None
    assert not caplog.records
    # slurmctld sends the signal once the end is within signal_seconds + 30 s: at once
    assert warn_early_signal(experiment, 120) == 120
    assert "Slurm may send the signal before the engine starts" in caplog.text
    assert "runtime well above 130 s" in caplog.text


def test_remaining_time_from_slurm(monkeypatch, tmp_path):
    now = time.time()
    left = remaining_job_seconds({"SLURM_JOB_END_TIME": str(int(now) + 120)})
    assert 118 <= left <= 121
    assert remaining_job_seconds({}) is None
    assert parse_slurm_time("1-02:03:04") == ((24 + 2) * 60 + 3) * 60 + 4
    assert parse_slurm_time("05:06") == 306
    assert parse_slurm_time("UNLIMITED") is None
    # without SLURM_JOB_END_TIME: squeue's %L of the job
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text("#!/bin/sh\necho 1:02:03\n")
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert remaining_job_seconds({"SLURM_JOB_ID": "9"}) == 3723
