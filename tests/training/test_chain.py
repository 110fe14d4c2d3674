"""The chain's parts that need no Slurm: the sbatch options (the official plugin's own),
what `hpcllm status` shows of a chain, `hpcllm cancel-training` without squeue, and what a
rerun does with a stopped chain (stand-in squeue and sbatch). The chain itself runs on the
test cluster (tests/slurm/test_training.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import EXAMPLES

from hpcllm import cli
from hpcllm.training.campaign import chain, status


def test_the_segment_jobs_sbatch_options_are_the_plugins_for_the_rules_resources():
    resources = {
        "nodes": 4,
        "tasks": 4,
        "tasks_per_gpu": 0,
        "mpi": "",
        "gres": "gpu:4",
        "cpus_per_task": 48,
        "mem_mb": 400000,
        "runtime": 240,
        "slurm_partition": "booster",
        "slurm_account": "opengptx",
        "constraint": "a100",
        "qos": "normal",
        "slurm_extra": "--ntasks-per-node=1 --signal=USR2@300 --threads-per-core=1",
    }
    settings = SimpleNamespace(requeue=False, no_requeue=True, qos=None, reservation=None)
    args = chain.sbatch_geometry(resources, threads=1, settings=settings)
    line = " ".join(args)
    for part in (
        "-A opengptx", "-p booster", "-t 240", "-C a100", "--qos=normal", "--mem 400000",
        "--nodes=4", "--no-requeue", "--cpus-per-task=48", "--gres=gpu:4",
        "--ntasks-per-node=1 --signal=USR2@300 --threads-per-core=1",
    ):  # fmt: skip
        assert part in line, line
    # tasks_per_gpu=0 switches --ntasks-per-gpu off, as for the rule's own job
    assert "--ntasks-per-gpu" not in line
    # the chain sets its own name, log, comment, working directory and command
    assert not {"--job-name", "--output", "--comment", "-D", "--wrap", "sbatch"} & set(args)


def test_a_job_submitting_its_successor_passes_on_no_slurm_job_variables():
    env = chain._clean_environment(
        {"PATH": "/bin", "SLURM_CONF": "/c", "SLURM_JOB_ID": "7", "SLURM_MEM_PER_NODE": "9",
         "SBATCH_PARTITION": "x", "SRUN_CPUS_PER_TASK": "2"}
    )  # fmt: skip
    assert env == {"PATH": "/bin", "SLURM_CONF": "/c"}


def test_status_lists_the_chain_and_names_where_it_stopped(tmp_path):
    save = tmp_path / "checkpoints" / "tiny_local"
    (save / "chain").mkdir(parents=True)
    (save / "iter_0000010").mkdir()
    (save / "latest_checkpointed_iteration.txt").write_text("10")
    name = chain.job_name_of(tmp_path, "tiny_local")
    jobs = [
        {"id": "41", "state": "RUNNING", "name": name, "dependency": "(null)", "comment": ""},
        {"id": "42", "state": "PENDING", "name": name, "dependency": "afterany:41(unfulfilled)",
         "comment": ""},
        {"id": "43", "state": "RUNNING", "name": "hpcllm-chain-tiny_local-00000000",
         "dependency": "", "comment": ""},  # another checkout's chain
    ]  # fmt: skip
    out = status.campaign_status(tmp_path, [str(EXAMPLES)], jobs=jobs)
    assert "jobs: 41 RUNNING chain seg2, 42 PENDING chain next (afterany:41(unfulfilled))" in out, (
        out
    )
    assert "43" not in out
    (save / "chain" / "stopped.json").write_text(
        json.dumps({"chain": "1", "segment": 2, "failure": "missing_file", "job_id": "42",
                    "message": "...", "time": 0})
    )  # fmt: skip
    out = status.campaign_status(tmp_path, [str(EXAMPLES)], jobs=[])
    assert "last failure: missing_file (job 42); the chain stopped at segment 2" in out, out


def test_status_after_a_checksum_refusal_names_the_file_and_the_fix_that_keeps_the_campaign(
    tmp_path,
):
    """Segment 3's attempt refused the committed checkpoint (iteration 20) as damaged:
    status shows the refusal's class, the damaged file and the way back, and that the
    checkpoint was refused. After that way back (iteration 20 removed, the tracker at 10),
    it names --forcerun of segment 2's record, which trains on from iteration 10, before
    restart-training, which starts over."""
    from hpcllm.training.campaign import attempts

    save = tmp_path / "checkpoints" / "tiny_local"
    for it in (10, 20):
        (save / f"iter_{it:07d}").mkdir(parents=True)
    (save / "latest_checkpointed_iteration.txt").write_text("20")
    results = tmp_path / "results" / "train" / "tiny_local"
    results.mkdir(parents=True)
    for k, it in ((1, 10), (2, 20)):
        (results / f"seg{k}.json").write_text(json.dumps({"segment": k, "last_iteration": it}))
    logs = tmp_path / "logs" / "train_segment" / "tiny_local"
    logs.mkdir(parents=True)
    refusal = (
        f"CheckpointError: {save}/iter_0000020/model.pt: damaged, its contents differ from "
        "those committed. Resuming iteration 20 would train on damaged weights. The previous "
        f"committed checkpoint, iteration 10, verifies: resume from it with `rm -r "
        f"{save}/iter_0000020 && echo 10 > {save}/latest_checkpointed_iteration.txt`, then rerun"
    )
    entry = attempts.record_start(logs / "seg3.attempts.json", 1, 20, environ={})
    attempts.record_end(logs / "seg3.attempts.json", entry, 20, "checkpoint_error", refusal)
    out = status.campaign_status(tmp_path, [str(EXAMPLES)], jobs=[])
    assert f"last failure: checkpoint_error (job -): {refusal}" in out, out
    assert "checkpoint iteration 20/30 (0.010 M tokens), refused by the last attempt" in out, out

    (save / "iter_0000020").rmdir()  # the way back the refusal names
    (save / "latest_checkpointed_iteration.txt").write_text("10")
    out = status.campaign_status(tmp_path, [str(EXAMPLES)], jobs=[])
    keep = f"To train on from iteration 10, keeping the campaign: run the workflow with --forcerun {results}/seg2.json"
    assert keep in out and out.index(keep) < out.index("hpcllm restart-training"), out


def test_cancel_training_without_squeue_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no squeue, no scancel
    assert cli.main(["cancel-training", "tiny_local", "-d", str(tmp_path)]) == 1
    assert "not cancelled: squeue could not be run" in capsys.readouterr().err


def test_cancel_training_cancels_the_experiments_chain_only(tmp_path, monkeypatch, capsys):
    """With stand-in squeue and scancel (the real ones: tests/slurm/test_training.py)."""
    name = chain.job_name_of(tmp_path, "tiny_local")
    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n'
        f"case \"$*\" in *%j*) echo '51|RUNNING|(null)|None|{name}'; "
        f"echo '52|PENDING|afterany:51|Dependency|{name}'; "
        "echo '53|RUNNING|(null)|None|hpcllm-chain-tiny_local-00000000';; esac\n"
    )
    (bin_dir / "scancel").write_text(f'#!/bin/sh\necho scancel "$@" >> {calls}\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    assert cli.main(["cancel-training", "tiny_local", "-d", str(tmp_path)]) == 0
    assert "cancelled the chain of tiny_local: job(s) 51, 52" in capsys.readouterr().out
    assert calls.read_text().splitlines()[-1] == "scancel 51 52"


@pytest.mark.parametrize("tracker,expected", [(None, 0), ("20", 20), ("junk", 0)])
def test_a_save_in_progress_is_not_committed(tmp_path, tracker, expected):
    (tmp_path / "iter_0000030").mkdir()  # being written: no tracker names it yet
    if tracker is not None:
        (tmp_path / "latest_checkpointed_iteration.txt").write_text(tracker)
    assert chain.committed_iteration(tmp_path) == expected


def stand_in_slurm(tmp_path, monkeypatch, squeue_lines: str = "") -> tuple:
    """squeue printing ``squeue_lines``; sbatch answering job 61; both log their calls."""
    calls = tmp_path / "calls"
    return fake_slurm(
        tmp_path,
        monkeypatch,
        squeue=f"printf '{squeue_lines}'",
        sbatch=f'echo sbatch "$@" >> {calls}\necho 61',
    )


def fake_slurm(tmp_path, monkeypatch, **bodies: str) -> Path:
    """Stand-in commands (name: shell script body) first on PATH; the file
    ``tmp_path/calls`` their bodies may log to."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in bodies.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return tmp_path / "calls"


def three_segments(tmp_path, reached: int) -> chain.Campaign:
    """A campaign of 3 segments of 4 iterations whose checkpoint is at ``reached``."""
    save = tmp_path / "checkpoints" / "tiny_local"
    (save / "chain").mkdir(parents=True)
    (save / "latest_checkpointed_iteration.txt").write_text(str(reached))
    prepared = SimpleNamespace(experiment={"segments": 3, "iterations_per_segment": 4})
    return chain.Campaign(
        name="tiny_local", prepared=prepared, cluster=None, workdir=str(tmp_path),
        container=None, sbatch=["-p", "batch"], max_attempts=3,
    )  # fmt: skip


def stop(campaign: chain.Campaign, failure: str) -> None:
    (campaign.folder() / "stopped.json").write_text(
        json.dumps({"chain": "1", "segment": 2, "failure": failure, "job_id": "57",
                    "message": "FileNotFoundError: fineweb_text_document.bin", "time": 5})
    )  # fmt: skip


def test_a_rerun_does_not_resubmit_a_chain_stopped_for_good_until_told(
    tmp_path, monkeypatch, capsys
):
    """missing_file in segment 2: the rerun names class and job and submits nothing;
    after `hpcllm retry-training` the next one submits the chain anew."""
    calls = stand_in_slurm(tmp_path, monkeypatch)
    campaign = three_segments(tmp_path, reached=4)
    stop(campaign, "missing_file")
    with pytest.raises(chain.ChainStopped) as refused:
        chain.wait_for_segment(campaign, 2, poll_seconds=0)
    message = str(refused.value)
    assert "stopped at segment 2: missing_file in Slurm job 57" in message, message
    assert "hpcllm retry-training tiny_local" in message and "iteration 4" in message, message
    assert not calls.exists()  # nothing submitted
    shown = status.campaign_status(tmp_path, [str(EXAMPLES)], jobs=[])
    assert "fix the cause, then `hpcllm retry-training tiny_local`" in shown, shown

    assert cli.main(["retry-training", "tiny_local", "-d", str(tmp_path)]) == 0
    assert "cleared: the chain of tiny_local stopped at segment 2" in capsys.readouterr().out
    assert chain.stopped(campaign.folder().parent) is None
    assert (campaign.folder() / "stopped.5.json").is_file()  # kept
    state, jobs = chain.ensure(campaign)
    assert (state, jobs[0]["id"]) == ("submitted", "61")
    assert len(calls.read_text().splitlines()) == 1
    assert cli.main(["retry-training", "tiny_local", "-d", str(tmp_path)]) == 0
    assert "its chain has not stopped; nothing to clear" in capsys.readouterr().out


@pytest.mark.parametrize("failure", [None, "time_limit", "max_attempts", "cancelled"])
def test_a_rerun_resubmits_a_chain_stopped_for_a_reason_that_may_pass_and_says_so(
    tmp_path, monkeypatch, failure
):
    """None: no chain yet (or one whose successor could not be submitted: no stop)."""
    calls = stand_in_slurm(tmp_path, monkeypatch)
    campaign = three_segments(tmp_path, reached=4)
    if failure:
        stop(campaign, failure)
    said = []
    monkeypatch.setattr(chain, "commit_record", lambda c, k, settled=False: bool(calls.exists()))
    chain.wait_for_segment(campaign, 2, poll_seconds=0, say=said.append)
    assert len(calls.read_text().splitlines()) == 1
    if failure is None:
        assert said[0] == (
            "submitted the chain of tiny_local: job 61; segment 1 of 3 committed "
            "(checkpoint iteration 4 of 12)"
        ), said
        return
    assert said[0].startswith(
        f"submitted the chain of tiny_local (the chain of tiny_local stopped at segment 2: "
        f"{failure} in Slurm job 57"
    ), said
    assert "a new attempt budget): job 61; segment 1 of 3 committed" in said[0], said


def test_a_rerun_reattaches_to_the_chain_in_slurm_and_says_what_it_found(tmp_path, monkeypatch):
    name = chain.job_name_of(tmp_path, "tiny_local")
    assert name  # squeue is asked by name; the stand-in answers whatever it is asked
    calls = stand_in_slurm(
        tmp_path,
        monkeypatch,
        f"57|RUNNING|(null)|None|{name}\\n58|PENDING|afterany:57(unfulfilled)|JobHeldUser|{name}\\n",
    )
    campaign = three_segments(tmp_path, reached=8)
    chain.save(campaign)
    said = []
    done = iter([False, False, True])
    monkeypatch.setattr(chain, "commit_record", lambda c, k, settled=False: next(done))
    chain.wait_for_segment(campaign, 3, poll_seconds=0, say=said.append)
    assert not calls.exists()  # nothing submitted
    assert said[0] == (
        "the chain of tiny_local is in Slurm, segments 1-2 of 3 committed (checkpoint "
        "iteration 8 of 12); jobs: 57 RUNNING (segment 3), 58 PENDING after "
        "afterany:57(unfulfilled) [JobHeldUser]; waiting for segment 3"
    ), said


class FakeClock:
    """``time`` for chain: sleeps advance the clock at once and are recorded."""

    def __init__(self):
        self.now, self.slept = 1000.0, []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_controller_backs_off_while_the_chain_does_not_change(tmp_path, monkeypatch):
    """The login node's wait: squeue at most every poll_seconds, the interval growing by
    half while the jobs stay as they were (up to 4 times), back to poll_seconds when they
    change; a line only on a change."""
    name = chain.job_name_of(tmp_path, "tiny_local")
    calls = tmp_path / "calls"
    state = tmp_path / "state"
    state.write_text("PENDING")
    fake_slurm(
        tmp_path, monkeypatch,
        squeue=f'echo squeue >> {calls}\necho "57|$(cat {state})|(null)|None|{name}"',
    )  # fmt: skip
    campaign = three_segments(tmp_path, reached=4)
    chain.save(campaign)
    clock = FakeClock()
    monkeypatch.setattr(chain, "time", clock)
    polls = iter(range(100))

    def committed(c, k, settled=False):
        n = next(polls)
        if n == 7:  # the job starts at the 7th poll (the first look is before the loop)
            state.write_text("RUNNING")
        return n == 10

    monkeypatch.setattr(chain, "commit_record", committed)
    said = []
    chain.wait_for_segment(campaign, 2, poll_seconds=30, say=said.append)
    assert clock.slept == [30, 45, 67.5, 101.25, 120, 120, 30, 45, 67.5]
    # ensure's own look, then one per poll (each listing older than 30 s)
    assert len(calls.read_text().splitlines()) == 1 + 9
    waiting = [line for line in said if line.startswith("waiting for segment 2")]
    assert [line.rsplit("chain jobs: ", 1)[1] for line in waiting] == [
        "57 PENDING", "57 RUNNING (segment 2)"
    ]  # fmt: skip


def test_the_waits_of_all_experiments_share_one_squeue(tmp_path, monkeypatch):
    """Two experiments' controller jobs (threads here, processes on a login node) that
    wake together run one squeue; each finds its own chain's jobs in the listing."""
    import threading

    a, b = chain.job_name_of(tmp_path, "a"), chain.job_name_of(tmp_path, "b")
    calls = tmp_path / "calls"
    fake_slurm(
        tmp_path, monkeypatch,
        squeue=f"echo squeue >> {calls}\nsleep 0.5\n"
        f"printf '1|RUNNING|(null)|None|{a}\\n2|PENDING|afterany:1|Dependency|{a}\\n"
        f"3|RUNNING|(null)|None|{b}\\n4|RUNNING|(null)|None|other|name\\n'",
    )  # fmt: skip
    shared = tmp_path / ".snakemake/hpcllm/squeue.json"
    found = {}

    def wait(name):
        found[name] = [j["id"] for j in chain.chain_jobs(name, shared, max_age=30)]

    threads = [threading.Thread(target=wait, args=(n,)) for n in (a, b, a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert found == {a: ["1", "2"], b: ["3"]}
    assert calls.read_text().splitlines() == ["squeue"]
    assert chain.chain_jobs("other|name") == [
        {
            "id": "4",
            "state": "RUNNING",
            "dependency": "(null)",
            "reason": "None",
            "name": "other|name",
        }
    ]  # fmt: skip  (a fresh look: the name may hold the separator)
    assert len(calls.read_text().splitlines()) == 2
    # an old listing is not used
    cached = json.loads(shared.read_text())
    shared.write_text(json.dumps({**cached, "time": cached["time"] - 31}))
    chain.chain_jobs(a, shared, max_age=30)
    assert len(calls.read_text().splitlines()) == 3


def test_a_shared_listing_older_than_the_chain_does_not_stop_the_wait(tmp_path, monkeypatch):
    """Another experiment's listing, taken before this chain was submitted, shows none of
    its jobs: the controller asks squeue itself before it calls the chain gone."""
    name = chain.job_name_of(tmp_path, "tiny_local")
    fake_slurm(tmp_path, monkeypatch, squeue=f"echo '57|RUNNING|(null)|None|{name}'")
    campaign = three_segments(tmp_path, reached=4)
    chain.save(campaign)
    shared = tmp_path / ".snakemake/hpcllm/squeue.json"
    shared.parent.mkdir(parents=True)
    clock = FakeClock()
    shared.write_text(json.dumps({"time": clock.now, "jobs": []}))  # fresh, from before
    monkeypatch.setattr(chain, "time", clock)
    # not committed: before the wait, at the poll, after the empty listing; then done
    done = iter([False, False, False, False, True])
    monkeypatch.setattr(chain, "commit_record", lambda c, k, settled=False: next(done))
    said = []
    chain.wait_for_segment(campaign, 2, poll_seconds=30, say=said.append)
    assert any("chain jobs: 57 RUNNING (segment 2)" in line for line in said), said


def test_a_stop_at_a_segment_committed_since_does_not_hold_the_chain_back(tmp_path, monkeypatch):
    """Segment 2 stopped with missing_file, then trained by a run without the chain: the
    next chained run submits for segment 3."""
    calls = stand_in_slurm(tmp_path, monkeypatch)
    campaign = three_segments(tmp_path, reached=8)
    stop(campaign, "missing_file")
    state, _ = chain.ensure(campaign)
    assert state == "submitted" and len(calls.read_text().splitlines()) == 1


def test_the_plugins_exclude_failed_nodes_setting_reaches_the_chain_jobs():
    settings = SimpleNamespace(
        requeue=False, no_requeue=False, qos=None, reservation=None,
        exclude_failed_nodes="n7, n3,",
    )  # fmt: skip
    args = chain.sbatch_geometry({"nodes": 2, "runtime": 30}, settings=settings)
    assert "--exclude=n3,n7" in args, args


def test_a_chain_job_passes_on_the_chains_environment_not_what_its_job_added(tmp_path, monkeypatch):
    """The successor gets the variables the chain was submitted with (their values now),
    not the GPUs, thread counts or offline switches of the job submitting it; and it
    waits for its predecessor and for any other job of the chain (singleton)."""
    env_file = tmp_path / "env"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        f'#!/bin/sh\necho "$@" > {env_file}.args\nenv > {env_file}\necho 62\n'
    )
    (bin_dir / "sbatch").chmod(0o755)
    for name in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "HF_HUB_OFFLINE", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("TEAM_SETTING", "login")
    campaign = three_segments(tmp_path, reached=4)
    campaign.exported = tuple(sorted(chain._clean_environment(os.environ)))
    # now inside the chain job: what Slurm and the job itself set
    monkeypatch.setenv("SLURM_JOB_ID", "61")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TEAM_SETTING", "job")
    assert chain.submit(campaign, after="61") == "62"
    passed = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    assert not {"CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "HF_HUB_OFFLINE", "SLURM_JOB_ID"} & set(
        passed
    ), passed
    assert passed["TEAM_SETTING"] == "job" and passed["PATH"].startswith(str(bin_dir))
    assert "--dependency=afterany:61,singleton" in (tmp_path / "env.args").read_text()


def lease_holder_slurm(tmp_path, monkeypatch, holder: str, chain_lines: str) -> Path:
    """squeue: job ``holder`` RUNNING when asked by id, ``chain_lines`` when asked for
    the listing; sbatch answering job 62; scancel logged."""
    calls = tmp_path / "calls"
    return fake_slurm(
        tmp_path,
        monkeypatch,
        squeue=f"case \"$*\" in *'-j {holder}'*) echo RUNNING;; *%j*) printf '{chain_lines}';; esac",
        sbatch=f'echo sbatch "$@" >> {calls}\necho 62',
        scancel=f'echo scancel "$@" >> {calls}',
    )


@pytest.mark.parametrize("holder_in_chain", [True, False])
def test_a_held_lease_does_not_stop_the_chain_for_good(tmp_path, monkeypatch, holder_in_chain):
    """Job 61 finds the lease held by live job 57. Of its own chain (a second head, e.g.
    after a requeue): it trains nothing, writes no stop, and its successor waits for 57.
    Outside the chain (a plugin job): the chain stops with ``lease_held``, which the next
    run submits anew; never ``error``, which would need `hpcllm retry-training`."""
    from hpcllm.training.checkpoints import lease

    monkeypatch.chdir(tmp_path)
    name = chain.job_name_of(tmp_path, "tiny_local")
    lines = f"57|RUNNING|(null)|None|{name}\\n61|RUNNING|(null)|None|{name}\\n"
    lines = lines if holder_in_chain else ""
    calls = lease_holder_slurm(tmp_path, monkeypatch, "57", lines)
    campaign = three_segments(tmp_path, reached=4)
    chain.save(campaign)
    save = tmp_path / campaign.save
    (save / "iter_0000004").mkdir()
    (save / lease.LEASE).write_text(
        json.dumps({"job_id": "57", "host": "n1", "pid": 1, "renewed": 0.0})
    )
    monkeypatch.setenv("SLURM_JOB_ID", "61")
    status_code = chain.step(campaign.file(), environ={"SLURM_JOB_ID": "61"})
    submitted = [line for line in calls.read_text().splitlines() if line.startswith("sbatch")]
    assert len(submitted) == 1 and "--dependency=afterany:61,singleton" in submitted[0]
    stop = chain.stopped(save)
    if holder_in_chain:
        assert status_code == 0 and stop is None
        assert "scancel" not in calls.read_text()
    else:
        assert status_code == 1 and stop["failure"] == "lease_held", stop
        assert "is being written by Slurm job 57" in stop["message"], stop
        assert not chain.needs_a_fix(stop)
        assert calls.read_text().splitlines()[-1] == "scancel 62"
    assert json.loads((save / lease.LEASE).read_text())["job_id"] == "57"  # untouched


def counting_slurm(tmp_path, monkeypatch, squeue_lines: str = "") -> Path:
    """sbatch answering jobs 71, 72, ... in turn; squeue printing ``squeue_lines``;
    scancel; all log their calls."""
    calls = tmp_path / "calls"
    return fake_slurm(
        tmp_path,
        monkeypatch,
        sbatch=f'echo sbatch "$@" >> {calls}\necho $((70 + $(grep -c ^sbatch {calls})))',
        squeue=f"printf '{squeue_lines}'",
        scancel=f'echo scancel "$@" >> {calls}',
    )


def test_a_chain_submitted_up_front_has_a_job_per_segment_left_and_the_retries(
    tmp_path, monkeypatch
):
    """Where compute nodes may not call sbatch: segments 2 and 3 to train and 2 retries
    (max_attempts 3), each job afterok the one before, singleton, --kill-on-invalid-dep;
    a job of it submits nothing, and one that finds the chain stopped ends at once with
    the status that ends the chain (Slurm cancels the jobs after it)."""
    calls = counting_slurm(tmp_path, monkeypatch)
    campaign = three_segments(tmp_path, reached=4)
    campaign.up_front = True
    state, jobs = chain.ensure(campaign)
    assert state == "submitted" and [j["id"] for j in jobs] == ["71", "72", "73", "74"]
    lines = calls.read_text().splitlines()
    assert lines[0].endswith("--dependency=singleton --wrap " + lines[0].split("--wrap ")[1])
    for k, line in enumerate(lines[1:], start=71):
        assert f"--dependency=afterok:{k},singleton --kill-on-invalid-dep=yes" in line, line
    assert [e["after"] for e in chain.submitted_jobs(tmp_path / campaign.save)] == [
        None, "71", "72", "73"
    ]  # fmt: skip

    saved = chain.load(campaign.file())
    (saved.folder() / "stopped.json").write_text(
        json.dumps({"chain": saved.chain_id, "segment": 2, "failure": "out_of_memory",
                    "job_id": "72", "message": "CUDA out of memory", "time": 5})
    )  # fmt: skip
    assert chain.step(campaign.file(), environ={"SLURM_JOB_ID": "73"}) == chain.ENDS_CHAIN
    assert len(calls.read_text().splitlines()) == 4  # no sbatch, no scancel


def test_the_controller_cancels_the_spares_of_a_chain_submitted_up_front(tmp_path, monkeypatch):
    """A stop: the pending jobs are cancelled and the stop named. The campaign complete:
    the pending spares are cancelled."""
    name = chain.job_name_of(tmp_path, "tiny_local")
    calls = counting_slurm(tmp_path, monkeypatch, f"74|PENDING|afterany:73|Dependency|{name}\\n")
    campaign = three_segments(tmp_path, reached=4)
    campaign.up_front, campaign.chain_id = True, "c1"
    chain.save(campaign)
    (campaign.folder() / "stopped.json").write_text(
        json.dumps({"chain": "c1", "segment": 2, "failure": "out_of_memory", "job_id": "72",
                    "message": "CUDA out of memory", "time": 5})
    )  # fmt: skip
    with pytest.raises(chain.ChainStopped, match="out_of_memory in Slurm job 72"):
        chain.wait_for_segment(campaign, 2, poll_seconds=0)
    assert calls.read_text().splitlines() == ["scancel 74"]

    calls.unlink()
    (tmp_path / campaign.save / "latest_checkpointed_iteration.txt").write_text("12")
    said = []
    chain._cancel_spares(campaign, say=said.append)
    assert calls.read_text().splitlines() == ["scancel 74"]
    assert said == ["tiny_local: the campaign is complete; cancelled its spare jobs 74"]


@pytest.mark.parametrize(
    "reason,partition,ends",
    [
        ("QOSMaxNodePerJobLimit", "", True),
        ("PartitionTimeLimit", "", True),
        ("InvalidAccount", "", True),
        # the job asks for 2 nodes, the partition allows 1: never
        ("PartitionNodeLimit", "MaxNodes=1 TotalNodes=4", True),
        # within the partition's limits: some of its nodes are down, which ends by itself
        ("PartitionNodeLimit", "MaxNodes=UNLIMITED TotalNodes=4", False),
        ("Resources", "", False),
        ("Priority", "", False),
        ("QOSJobLimit", "", False),  # the QOS's running jobs: clears as they end
    ],
)  # fmt: skip
def test_the_wait_ends_only_behind_a_limit_slurm_does_not_resolve(
    tmp_path, monkeypatch, reason, partition, ends
):
    """The login node's wait behind a job pending for a reason that will not resolve by
    itself stops at once, cancelling the chain's pending jobs and naming the reason and
    the cluster fact to change; behind one that will (the queue, a node that is down) it
    goes on waiting."""
    name = chain.job_name_of(tmp_path, "tiny_local")
    calls = fake_slurm(
        tmp_path, monkeypatch,
        squeue=f'echo "57|PENDING|(null)|{reason}|{name}"\n'
               f'echo "58|PENDING|afterany:57(unfulfilled)|Dependency|{name}"',
        scontrol='if [ "$2" = job ]; then echo "JobId=57 NumNodes=2 Partition=limited"; '
                 f'else echo "PartitionName=limited {partition}"; fi',
        scancel=f'echo "scancel $*" >> {tmp_path / "calls"}',
    )  # fmt: skip
    campaign = three_segments(tmp_path, reached=4)
    campaign.cluster = SimpleNamespace(path="config/clusters/mn5.yaml")
    chain.save(campaign)
    clock = FakeClock()
    monkeypatch.setattr(chain, "time", clock)
    polls = iter(range(100))
    monkeypatch.setattr(chain, "commit_record", lambda c, k, settled=False: next(polls) == 3)
    if not ends:
        chain.wait_for_segment(campaign, 2, poll_seconds=30, say=lambda _: None)
        assert not calls.exists()  # nothing cancelled
        return
    with pytest.raises(chain.ChainStopped) as stopped:
        chain.wait_for_segment(campaign, 2, poll_seconds=30, say=lambda _: None)
    said = str(stopped.value)
    assert f"the chain of tiny_local: job 57 is PENDING for {reason}: " in said, said
    assert "which Slurm does not resolve by itself" in said, said
    if reason != "InvalidAccount":
        assert "config/clusters/mn5.yaml" in said, said
    assert said.endswith("(cancelled the chain's pending jobs 57 58)"), said
    assert calls.read_text() == "scancel 57 58\n"
    assert clock.slept == []  # at the first look


def test_every_limit_names_what_to_change():
    from hpcllm import slurm_pending

    for reason in slurm_pending.STUCK_REASONS:
        said = slurm_pending.stuck_message("57", reason, "the canary:", "config/clusters/x.yaml")
        assert said.startswith(f"the canary: job 57 is PENDING for {reason}: "), said
        assert "{" not in said and ". Change " in said, said
    assert slurm_pending.nodes_over_partition_limit(2, "1", "4")
    assert slurm_pending.nodes_over_partition_limit(5, "UNLIMITED", "4")
    assert not slurm_pending.nodes_over_partition_limit(2, "UNLIMITED", "4")
