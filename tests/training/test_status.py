"""`hpcllm status` on a campaign of weeks: the running attempt's GPU-hours, the time to
finish, the age of the newest log line, text preparation, a failing squeue, "done"; never
a stale model or failure as the current one; `hpcllm restart-training` really retrains."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import EXAMPLES
from test_workflow_changes import NAME, _other_experiments, configure, planned, snakemake

from hpcllm.training.campaign import status


def campaign(work, reached: int, segments_done: int) -> None:
    """tiny_local of the laptop examples (3 segments of 10 iterations) as files show it."""
    save = work / "checkpoints" / "tiny_local"
    (save / f"iter_{reached:07d}").mkdir(parents=True)
    (save / "latest_checkpointed_iteration.txt").write_text(str(reached))
    results = work / "results" / "train" / "tiny_local"
    results.mkdir(parents=True)
    for k in range(1, segments_done + 1):
        (results / f"seg{k}.json").write_text("{}")
    logs = work / "logs" / "train_segment" / "tiny_local"
    logs.mkdir(parents=True)
    line = (
        " iteration {i:8d}/{t:8d} | consumed samples: {c:12d} | elapsed time per iteration "
        "(ms): 2000.0 | lm loss: 5.0E+00 |\n"
    )
    (logs / "seg2.engine.log").write_text(
        "".join(line.format(i=i, t=30, c=8 * i) for i in range(11, reached + 1))
    )


def attempts(work, entries) -> None:
    path = work / "logs" / "train_segment" / "tiny_local" / "seg2.attempts.json"
    path.write_text(json.dumps(entries))


def test_a_running_slurm_attempt_counts_to_now_and_the_finish_is_estimated(tmp_path):
    campaign(tmp_path, reached=14, segments_done=1)
    now = time.time()
    attempts(
        tmp_path,
        [
            {"attempt": 1, "job_id": "77", "host": "n1", "start_iteration": 10,
             "started": now - 7200, "reached_iteration": 12, "failure": "node_failure",
             "ended": now - 5400},
            {"attempt": 2, "job_id": "78", "host": "n2", "start_iteration": 12,
             "started": now - 3600},
        ],
    )  # fmt: skip
    log = tmp_path / "logs/train_segment/tiny_local/seg2.engine.log"
    os.utime(log, (now - 600, now - 600))
    jobs = [
        {"id": "78", "state": "RUNNING", "comment": "rule_train_segment_wildcards_tiny_local_2"}
    ]
    out = status.campaign_status(tmp_path, profile="profiles/local", jobs=jobs)
    # 0.5 h of the failed attempt + 1 h of the running one, 1 GPU
    assert "1.50 GPU-hours spent (1.00 in the running attempt)" in out, out
    # 2 s per iteration, 30 - 14 iterations left
    assert "(about 32 s of training at the last segment's speed, queue time not included)" in out
    assert "newest engine log line: 10 min ago" in out
    assert "jobs: 78 RUNNING seg2" in out
    # the failed attempt was followed by another: not the current state
    assert "last failure" not in out
    assert "an earlier attempt failed (node_failure (job 77)), later ones ran" in out
    assert "tiny_local: 1/3 segments" in out and "tiny_local: done" not in out
    assert "sample_bpe/sample_en: 0/2 shards tokenized" in out


def test_a_finished_campaign_says_done_and_text_prep_counts_shards(tmp_path):
    campaign(tmp_path, reached=30, segments_done=3)
    tok = tmp_path / "data" / "tokenized" / "sample_bpe"
    (tok / "sample_en").mkdir(parents=True)
    (tok / "sample_en" / "0000_text_document.idx").write_bytes(b"")
    (tok / "fineweb_text_document.idx").write_bytes(b"")
    out = status.campaign_status(tmp_path, profile="profiles/local", jobs=[])
    assert "tiny_local: done, 3/3 segments, checkpoint iteration 30/30" in out, out
    assert "to finish" not in out and "newest engine log line" not in out
    assert "sample_bpe/sample_en: 1/2 shards tokenized" in out
    assert "sample_bpe/fineweb: merged" in out


def test_a_local_attempt_holding_the_lease_counts_to_now(tmp_path):
    campaign(tmp_path, reached=12, segments_done=1)
    now = time.time()
    attempts(
        tmp_path,
        [{"attempt": 1, "job_id": None, "host": socket.gethostname(), "start_iteration": 10,
          "started": now - 1800}],
    )  # fmt: skip
    lease = tmp_path / "checkpoints" / "tiny_local" / "writer.lease"
    lease.write_text(
        json.dumps({"job_id": None, "host": socket.gethostname(), "pid": os.getpid(),
                    "renewed": now})
    )  # fmt: skip
    out = status.campaign_status(tmp_path, profile="profiles/local", jobs=[])
    assert "0.50 GPU-hours spent (0.50 in the running attempt)" in out, out


NO_SLURM_CONF = """squeue: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host
squeue: error: fetch_config: DNS SRV lookup failed
squeue: error: _establish_config_source: failed to fetch config
squeue: fatal: Could not establish a configuration source"""


@pytest.mark.parametrize(
    "stderr, shown",
    [
        ("slurm_load_jobs error: Unable to contact slurm controller",
         "slurm_load_jobs error: Unable to contact slurm controller"),
        # Slurm's clients without a slurm.conf (this machine: FACTS.md): one clean line
        (NO_SLURM_CONF, "squeue: fatal: Could not establish a configuration source"),
    ],
)  # fmt: skip
def test_a_failing_squeue_is_reported_not_shown_as_no_jobs(tmp_path, monkeypatch, stderr, shown):
    campaign(tmp_path, reached=12, segments_done=1)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "squeue").write_text(f"#!/bin/sh\ncat >&2 <<'EOF'\n{stderr}\nEOF\nexit 1\n")
    (fake / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HPCLLM_ACCOUNT", "proj")
    out = status.campaign_status(tmp_path, [str(EXAMPLES)], profile="profiles/testcluster")
    (line,) = [x for x in out.splitlines() if "jobs: " in x]
    assert line.endswith(
        f"jobs: unknown: Slurm could not be asked ({shown}; run hpcllm status where Slurm's "
        "commands reach the cluster, e.g. a login node)"
    ), out
    assert "jobs: none" not in out and "resolve_ctls" not in out
    assert "stalled" not in out  # the jobs are unknown, not none


def test_a_missing_configfile_is_named_without_a_traceback(tmp_path):
    hpcllm = os.path.join(os.path.dirname(sys.executable), "hpcllm")
    proc = subprocess.run(
        [hpcllm, "status", "-d", str(tmp_path), "--configfile", "nope.yaml"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--configfile nope.yaml: no such file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_segment_records_of_checkpoints_no_longer_there_are_not_counted(tmp_path):
    """Records of 4 segments (a longer campaign before), none of whose checkpoints is there
    (moved aside by hand): not "done, 4/3 segments, checkpoint iteration -/30"."""
    results = tmp_path / "results" / "train" / "tiny_local"
    results.mkdir(parents=True)
    for k in range(1, 5):
        (results / f"seg{k}.json").write_text(json.dumps({"last_iteration": 10 * k}))
    (tmp_path / "checkpoints" / "tiny_local").mkdir(parents=True)
    out = status.campaign_status(tmp_path, profile="profiles/local", jobs=[])
    assert "tiny_local: 0/3 segments, checkpoint iteration -/30" in out, out
    assert "stale files: " in out and "seg1.json, seg2.json, seg3.json record iterations" in out
    assert "hpcllm restart-training tiny_local" in out


def block(out: str, name: str) -> str:
    """An experiment's lines of the status output."""
    lines = out.splitlines()
    start = lines.index(next(line for line in lines if line.startswith(f"  {name}: ")))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("    ")), None)
    return "\n".join(lines[start:end])


def hpcllm(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "hpcllm"), *args],
        capture_output=True, text=True, cwd=cwd, timeout=120,
    )  # fmt: skip


@pytest.mark.workflow
def test_a_changed_model_is_not_shown_as_current_and_a_restart_trains_every_segment(
    text_workdir, tmp_path
):
    """A finished campaign of 2 x 4 iterations (a real tiny training); a weight-determining
    change makes its checkpoints stale in `hpcllm status`; `hpcllm restart-training` (from
    another folder, with -d) moves checkpoints, records and logs aside, after which status
    (with -d too) shows a fresh experiment and a dry run plans every segment again."""
    work = tmp_path / "work"
    shutil.copytree(text_workdir, work, symlinks=True, ignore=_other_experiments)
    cfg = configure(work)
    snakemake(work, "--configfile", cfg)
    files = [str(EXAMPLES), cfg]
    out = block(status.campaign_status(work, files, profile="profiles/local", jobs=[]), NAME)
    assert f"{NAME}: done, 2/2 segments, checkpoint iteration 8/8" in out, out
    assert "loss -" not in out and "stale" not in out

    configure(work, optim__lr=0.002)
    out = block(status.campaign_status(work, files, profile="profiles/local", jobs=[]), NAME)
    assert f"{NAME}: 0/2 segments, checkpoint iteration -/8 (0.000 M tokens)" in out, out
    assert "were trained with other settings (optim.lr: 0.003 -> 0.002)" in out
    assert "loss - (validation -)" in out and f"{NAME}: done" not in out

    configure(work)  # the same settings: only a restart trains the experiment again
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    restart = hpcllm("restart-training", NAME, "-d", str(work), cwd=elsewhere)
    assert restart.returncode == 0, restart.stderr
    for folder in ("checkpoints", "results/train", "logs/train_segment"):
        (aside,) = (work / folder).glob(f"{NAME}.replaced-*")
        assert f"{work / folder / NAME} to {aside}" in restart.stdout, restart.stdout
    assert (work / f"checkpoints/{aside.name}/iter_0000008").is_dir()
    assert (work / f"results/train/{aside.name}/seg2.json").is_file()
    assert (work / f"logs/train_segment/{aside.name}/seg2.attempts.json").is_file()

    # status from another folder: the run's files relative to the -d directory
    shown = hpcllm(
        "status", "-d", str(work), "--configfile", "config/examples/local.yaml", "chg.yaml",
        "--profile", "profiles/local", cwd=elsewhere,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    out = block(shown.stdout, NAME)
    assert f"{NAME}: 0/2 segments, checkpoint iteration -/8 (0.000 M tokens)" in out, out
    assert "loss - (validation -)" in out and "failure" not in out and "stale" not in out

    proc = snakemake(work, "-n", "--configfile", cfg)
    jobs = planned(proc.stdout + proc.stderr)
    assert jobs.get("train_segment") == 2, proc.stdout[-3000:]


def test_a_restart_is_refused_while_a_segment_writes_and_moves_nothing(tmp_path):
    """A live writer holds the checkpoint folder's lease: neither its checkpoints nor the
    segment records and logs it writes are moved."""
    campaign(tmp_path, reached=12, segments_done=1)
    save = tmp_path / "checkpoints" / "tiny_local"
    writer = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from hpcllm.training.checkpoints import lease\n"
         "with lease.held(sys.argv[1]):\n    print('held', flush=True); time.sleep(600)",
         str(save)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert writer.stdout.readline() == "held\n"
        refused = hpcllm("restart-training", "tiny_local", "-d", str(tmp_path), cwd=tmp_path)
    finally:
        writer.kill()
        writer.wait()
    assert refused.returncode == 1 and f"process {writer.pid}" in refused.stderr, refused.stderr
    assert (save / "iter_0000012").is_dir()
    assert (tmp_path / "results/train/tiny_local/seg1.json").is_file()
    assert (tmp_path / "logs/train_segment/tiny_local/seg2.engine.log").is_file()
    assert not list(tmp_path.glob("*/*.replaced-*")) + list(tmp_path.glob("*/*/*.replaced-*"))


def test_a_key_unset_by_null_in_a_configfile_is_read_as_the_workflow_reads_it(tmp_path):
    """`mirror: null` removes the examples' mirror (common.smk's unset_nulls): status reads
    the config instead of failing its schema on the null."""
    unset = tmp_path / "unset.yaml"
    unset.write_text("text:\n  sources:\n    fineweb:\n      mirror: null\n")
    out = status.campaign_status(tmp_path, [str(EXAMPLES), str(unset)], jobs=[])
    assert "sample_bpe/fineweb: 0/2 shards tokenized" in out, out


def test_the_finish_is_laid_out_from_the_records_the_running_attempt_and_squeue_start(
    tmp_path,
):
    """Segment 1 measured 2 s/iteration and 80 s of start-up and save; segment 2's attempt
    runs (at iteration 14 of 20), segment 3's job is pending and squeue --start expects it
    in 500 s: it starts between segment 2's end (now) and then, the middle central, and
    ends 100 s after its start."""
    campaign(tmp_path, reached=10, segments_done=1)
    now = time.time()
    timing = {
        "job": {"id": "77", "submitted": None, "eligible": None, "started": now - 3000},
        "ended": now - 2900,
        "seconds_per_iteration": 2.0,
        "p10": 2.0,
        "p90": 2.0,
    }
    (tmp_path / "results/train/tiny_local/seg1.json").write_text(
        json.dumps({"segment": 1, "segments": 3, "resumed_from_iteration": 0,
                    "last_iteration": 10, "timing": timing})
    )  # fmt: skip
    attempts(
        tmp_path,
        [{"attempt": 1, "job_id": "78", "host": "n2", "start_iteration": 10,
          "started": now - 100}],
    )  # fmt: skip
    jobs = [
        {"id": "78", "state": "RUNNING", "comment": "rule_train_segment_wildcards_tiny_local_2"},
        {"id": "79", "state": "PENDING", "comment": "rule_train_segment_wildcards_tiny_local_3"},
    ]
    out = status.campaign_status(
        tmp_path, profile="profiles/local", jobs=jobs, starts={"79": now + 500}
    )
    (line,) = [x.strip() for x in out.splitlines() if "expected to finish" in x]
    assert line.endswith(
        ", from: 2 s/iteration over 1 segment, 2 segments and 1 job left, start-up and save "
        "80 s per segment (measured), queue: the next job at squeue --start's time (the "
        "interval reaches back to starting at once: it counts other jobs' time limits)"
    ), line
    shown = time.mktime(time.strptime(line.split(": ", 1)[1][:19], "%Y-%m-%d %H:%M:%S"))
    assert abs(shown - (now + 250 + 100)) <= 2, line
    # the interval: segment 3 starting at once (low) to squeue's time at the slow end
    low, high = re.search(r"interval: (\S+) to (\S+)\)", line).groups()

    # (rate 2 s ±10 %, start-up and save 80 s ±50 %; segment 2 running since now - 100)
    def clock(hms: str) -> float:  # the shown time of day, on the day of ``now``
        day = time.strftime("%Y-%m-%d ", time.localtime(now))
        return time.mktime(time.strptime(day + hms, "%Y-%m-%d %H:%M:%S"))

    # each part alone at its end, added as independent errors: inside every part at its
    # end at once (now + 58 to now + 642), and the wait's own move (to squeue's time, 150
    # s later; starting at once, 250 s earlier) the largest
    assert now + 40 + 18 - 2 <= clock(low) <= now + 350 - 250 + 2, line
    assert now + 350 + 150 - 2 <= clock(high) <= now + 500 + 120 + 22 + 2, line
    assert clock(low) > now + 40 + 18 + 5 and clock(high) < now + 500 + 120 + 22 - 5, line


def _engine_lines(first: int, last: int, ms: float = 2000.0) -> str:
    return "".join(
        f" iteration {i:8d}/{30:8d} | consumed samples: {8 * i:12d} | elapsed time per "
        f"iteration (ms): {ms} | lm loss: 5.0E+00 |\n"
        for i in range(first, last + 1)
    )


def _to_finish(out: str) -> float:
    import re

    return float(re.search(r"about ([\d.]+) to finish", out)[1])


def test_the_gpu_hours_to_finish_fall_steadily_through_a_running_segment(tmp_path, monkeypatch):
    """Issue 51 item 4: the figure jumped 0.44 -> 0.67 -> 0.33 within one segment (the
    running attempt's hours counted, its iterations not yet). Now: the iterations left
    (from the running attempt's newest logged one) times the GPU-hours per iteration of
    the attempts that ended; it falls as the segment runs and hardly moves at its end."""
    campaign(tmp_path, reached=10, segments_done=1)
    logs = tmp_path / "logs/train_segment/tiny_local"
    (logs / "seg2.engine.log").write_text("")
    t0 = time.time() - 10_000
    (logs / "seg1.attempts.json").write_text(json.dumps(
        [{"attempt": 1, "job_id": "70", "host": "n1", "start_iteration": 0, "started": t0,
          "reached_iteration": 10, "ended": t0 + 3600}]))  # fmt: skip
    running = {"attempt": 1, "job_id": "71", "host": "n1", "start_iteration": 10,
               "started": t0 + 3700, "log_offset": 0}  # fmt: skip
    attempts(tmp_path, [running])
    jobs = [
        {"id": "71", "state": "RUNNING", "comment": "rule_train_segment_wildcards_tiny_local_2"}
    ]
    seen = []
    for logged in (11, 14, 17, 19):
        (logs / "seg2.engine.log").write_text(_engine_lines(11, logged))
        for now in (t0 + 3700 + 300 * (logged - 10), t0 + 3700 + 400 * (logged - 10)):
            monkeypatch.setattr(status.time, "time", lambda now=now: now)
            out = block(
                status.campaign_status(tmp_path, profile="profiles/local", jobs=jobs),
                "tiny_local",
            )
            seen.append(_to_finish(out))
    # 1 GPU-hour per 10 iterations of the ended attempt, 30 - logged iterations left
    assert seen == [1.9, 1.9, 1.6, 1.6, 1.3, 1.3, 1.1, 1.1], seen
    # The segment ends at 20: a checkpoint, the attempt's record; about the same figure.
    (tmp_path / "checkpoints/tiny_local/iter_0000020").mkdir()
    (tmp_path / "checkpoints/tiny_local/latest_checkpointed_iteration.txt").write_text("20")
    (tmp_path / "results/train/tiny_local/seg2.json").write_text("{}")
    attempts(tmp_path, [{**running, "reached_iteration": 20, "ended": t0 + 3700 + 3600}])
    monkeypatch.undo()
    out = block(status.campaign_status(tmp_path, profile="profiles/local", jobs=[]), "tiny_local")
    assert _to_finish(out) == 1.0, out


def test_a_new_attempt_shows_the_speed_the_last_segment_measured(tmp_path):
    """Issue 51 item 4: "last segment - tokens/s" whenever a new attempt had started (its
    engine log holds no interval yet): the newest measured figure is shown."""
    campaign(tmp_path, reached=20, segments_done=2)
    logs = tmp_path / "logs/train_segment/tiny_local"
    (logs / "seg2.engine.log").write_text(_engine_lines(11, 20, ms=500.0))
    (logs / "seg3.engine.log").write_text("")  # the next segment's attempt just started
    out = block(status.campaign_status(tmp_path, profile="profiles/local", jobs=[]), "tiny_local")
    assert "last segment - tokens/s" not in out, out
    assert "last segment " in out and " tokens/s" in out
    rate = float(out.split("last segment ")[1].split(" tokens/s")[0].replace(",", ""))
    (logs / "seg3.engine.log").write_text(_engine_lines(21, 22, ms=1000.0))
    later = block(status.campaign_status(tmp_path, profile="profiles/local", jobs=[]), "tiny_local")
    assert f"last segment {rate / 2:,.0f} tokens/s" in later, later


def test_a_job_past_its_last_checkpoint_is_still_its_segments_job(tmp_path):
    """Segment 2's job saved iteration 20 (its target) and still runs, its record not yet
    written: 2 segments and 1 job left, its own end first."""
    campaign(tmp_path, reached=20, segments_done=1)
    now = time.time()
    timing = {
        "job": {"id": "77", "submitted": now - 3100, "eligible": None, "started": now - 3000},
        "ended": now - 2900, "seconds_per_iteration": 2.0, "p10": 2.0, "p90": 2.0,
    }  # fmt: skip
    (tmp_path / "results/train/tiny_local/seg1.json").write_text(
        json.dumps({"segment": 1, "segments": 3, "resumed_from_iteration": 0,
                    "last_iteration": 10, "timing": timing})
    )  # fmt: skip
    attempts(
        tmp_path,
        [{"attempt": 1, "job_id": "78", "host": "n2", "start_iteration": 10,
          "started": now - 95}],
    )  # fmt: skip
    jobs = [
        {"id": "78", "state": "RUNNING", "comment": "rule_train_segment_wildcards_tiny_local_2"}
    ]
    out = status.campaign_status(tmp_path, profile="profiles/local", jobs=jobs)
    (line,) = [x.strip() for x in out.splitlines() if "expected to finish" in x]
    assert "2 segments and 1 job left" in line, line
    # its end (now + 5 s: start + 80 s + 10 x 2 s), then segment 3 after the measured
    # wait (100 s), 80 s and 10 x 2 s
    shown = time.mktime(time.strptime(line.split(": ", 1)[1][:19], "%Y-%m-%d %H:%M:%S"))
    assert abs(shown - (now + 5 + 100 + 100)) <= 2, line


def test_a_campaign_nothing_carries_on_is_stalled_without_a_date(tmp_path):
    """No job of it in Slurm, no local attempt, no Snakemake run in its folder: stalled,
    with the command that continues it; the results page says the same."""
    campaign(tmp_path, reached=10, segments_done=1)
    out = status.campaign_status(tmp_path, profile="profiles/local", jobs=[])
    (line,) = [x.strip() for x in out.splitlines() if "stalled" in x]
    assert line == (
        "stalled (no date): no job of it is running or queued and no Snakemake run works in "
        f"{tmp_path}; continue it with `snakemake --profile profiles/local` in {tmp_path}"
    )
    assert "expected to finish" not in out
    # a run's locks left behind (or a run on another login node): said so, still no date
    (tmp_path / ".snakemake" / "locks").mkdir(parents=True)
    (tmp_path / ".snakemake" / "locks" / "0.input.lock").write_text("x")
    out = status.campaign_status(tmp_path, profile="profiles/local", jobs=[])
    assert "a run's locks are in .snakemake/locks" in out and "expected to finish" not in out
    # a Snakemake run working there (between two jobs): not stalled
    fake = tmp_path / "bin" / "snakemake"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nsleep 60\n")
    fake.chmod(0o755)
    proc = subprocess.Popen([str(fake)], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 30  # hang guard
        while status.controller_state(tmp_path) != "alive":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        out = status.campaign_status(tmp_path, profile="profiles/local", jobs=[])
    finally:
        proc.kill()
        proc.wait()
    assert "stalled" not in out


def test_segment_one_has_a_date_from_the_plans_rate_then_its_own_iterations(tmp_path):
    """Segment 1's job runs: before it logs an iteration the plan's model rate gives the
    date (said so), then its own logged iterations."""
    from hpcllm.clusters import load_cluster
    from hpcllm.training.plan.experiment import prepare_experiment

    config = status.load_config(tmp_path, [], "profiles/local")
    prepared = prepare_experiment(
        "tiny_local", config["training"]["experiments"]["tiny_local"], config["text"],
        load_cluster("local", status.REPO / "config" / "clusters"),
    )  # fmt: skip
    now = time.time()
    logs = tmp_path / "logs" / "train_segment" / "tiny_local"
    logs.mkdir(parents=True)
    (logs / "seg1.attempts.json").write_text(json.dumps(
        [{"attempt": 1, "job_id": "70", "host": "n1", "start_iteration": 0, "started": now - 30}]
    ))  # fmt: skip
    jobs = [
        {"id": "70", "state": "RUNNING", "comment": "rule_train_segment_wildcards_tiny_local_1"}
    ]
    s = status.experiment_status(
        tmp_path, "tiny_local", prepared, jobs, now=now, model=(3.0, "the plan's model")
    )
    assert "from: 3 s/iteration from the plan's model (not measured" in s.calendar, s.calendar
    assert "3 segments and 2 jobs left" in s.calendar
    line = (
        " iteration {i:8d}/      30 | consumed samples: {c:12d} | elapsed time per iteration "
        "(ms): 2000.0 | lm loss: 5.0E+00 |\n"
    )
    (logs / "seg1.engine.log").write_text("".join(line.format(i=i, c=8 * i) for i in (1, 2, 3)))
    s = status.experiment_status(
        tmp_path, "tiny_local", prepared, jobs, now=now, model=(3.0, "the plan's model")
    )
    assert "from: 2 s/iteration over the running segment's first 3 logged iterations" in (
        s.calendar
    ), s.calendar


def test_a_job_pending_on_a_limit_slurm_does_not_resolve_is_named_with_the_fix(
    tmp_path, monkeypatch
):
    """Issue 47 item 4: status shows a segment's job pending for a partition's time limit
    as stuck, with what to change; a job pending for Resources or Priority is only pending.
    squeue is a script printing what the test cluster's squeue printed for such jobs."""
    campaign(tmp_path, reached=10, segments_done=1)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "squeue").write_text(
        '#!/bin/sh\ncase "$*" in *--start*) exit 0;; esac\n'
        "echo '81|PENDING|x|(null)|2026-11-28T15:00:00|PartitionTimeLimit|"
        "rule_train_segment_wildcards_tiny_local_2'\n"
        "echo '82|PENDING|y|(null)|2026-11-28T15:00:01|Resources|"
        "rule_train_segment_wildcards_tiny_local_3'\n"
    )
    (fake / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HPCLLM_ACCOUNT", "proj")
    out = status.campaign_status(tmp_path, [str(EXAMPLES)], profile="profiles/testcluster")
    (line,) = [x for x in out.splitlines() if "jobs: " in x]
    assert "81 PENDING seg2 [PartitionTimeLimit: the job's time limit is longer than its " \
        "partition allows; Slurm will not start it by itself: change gpu_partition." \
        "max_minutes in the cluster file" in line, line  # fmt: skip
    assert "82 PENDING seg3," in line + "," and "82 PENDING seg3 [" not in line, line
