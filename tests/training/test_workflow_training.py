"""The train_segment chain through Snakemake: a failed segment reruns alone and resumes;
bad experiments are refused at plan time (dry run)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from support import EXAMPLES, hang_guard
from test_forecast_coverage import check_the_page_of_a_finished_campaign
from training_helpers import run_snakemake, snakemake_cmd

from hpcllm.training.engines.log_lines import parse_log_lines

pytestmark = pytest.mark.workflow


def write_config(workdir: Path, name: str, experiment: dict, **training) -> str:
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"training": {"experiments": {name: experiment}, **training}}))
    return str(path)


def tiny(**overrides) -> dict:
    exp = {
        "engine": "torch",
        "preset": "tiny",
        "data": {"tokenizer": "sample_bpe", "sources": {"sample_en": 1.0}, "split": "98,2,0"},
        "layout": {"nodes": 1, "procs_per_node": 1},
        "segments": 3,
        "iterations_per_segment": 6,
        "save_interval": 2,
    }
    exp.update(overrides)
    return exp


def engine_pids(workdir: Path, save: str) -> list[int]:
    """Engine processes of this test: run in ``workdir``, saving to ``save``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if (
            b"hpcllm.training.engines.torch_engine" in cmd
            and save.encode() in cmd
            and cwd == str(workdir)
        ):
            pids.append(int(entry.name))
    return pids


def wait_for_log(proc, path: Path, text: str, timeout: float | None = None) -> None:
    deadline = time.time() + (timeout or hang_guard(30))  # the engine's line: ~30 s quiet
    while not (path.exists() and text in path.read_text()):
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read().decode()
        time.sleep(0.1)


def test_failed_segment_reruns_alone_and_resumes(text_workdir):
    """Segment 2 of 3 killed (a node dying) 3 iterations in; the rerun runs it alone.

    Each segment is 30 iterations: wherever the kill lands after iteration 33, the
    newest checkpoint (every 2 iterations) is one of segment 2's, short of its end. One
    attempt per segment, so that the run stops there (a SIGKILL is transient: a second
    attempt would continue it in the same run)."""
    work = text_workdir
    cfg = write_config(work, "rerun", tiny(iterations_per_segment=30), max_attempts=1)
    save = work / "checkpoints" / "rerun"
    engine_log = work / "logs/train_segment/rerun/seg2.engine.log"
    args = ["results/train/rerun/seg3.json", "--profile", "profiles/local", "--configfile", cfg]
    proc = subprocess.Popen(
        snakemake_cmd(work, *args), cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    wait_for_log(proc, engine_log, "iteration       33/")
    pids = engine_pids(work, "checkpoints/rerun")
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    out = proc.communicate(timeout=hang_guard(10))[0].decode()  # fails: ~10 s quiet
    assert proc.returncode != 0, out
    from hpcllm.training.checkpoints.tracker import latest_iteration

    newest = latest_iteration(save)
    assert 32 <= newest < 60 and newest % 2 == 0, newest
    assert (
        f"stopped at iteration {newest} of 60"
        in out + (work / "logs/train_segment/rerun/seg2.log").read_text()
    )
    # killed by SIGKILL, with no OOM record and no Slurm state saying otherwise: transient
    (entry,) = json.loads((work / "logs/train_segment/rerun/seg2.attempts.json").read_text())
    assert entry["failure"] == "signal", entry
    seg1 = work / "results/train/rerun/seg1.json"
    assert seg1.exists() and not (work / "results/train/rerun/seg2.json").exists()
    kept = {p: p.stat().st_mtime_ns for p in [seg1, *sorted((save / "iter_0000030").rglob("*"))]}

    proc = run_snakemake(work, *args)
    assert "rule train_segment" in proc.stdout + proc.stderr
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # segment 1 not run again
    last_launch = engine_log.read_text().split("==>")[-1]
    assert f"loaded checkpoint from checkpoints/rerun at iteration {newest}" in last_launch
    records = [
        json.loads((work / f"results/train/rerun/seg{k}.json").read_text()) for k in (1, 2, 3)
    ]
    assert [r["last_iteration"] for r in records] == [30, 60, 90]
    assert records[1]["resumed_from_iteration"] == newest
    first_loss = parse_log_lines((work / "logs/train_segment/rerun/seg1.engine.log").read_text())[
        0
    ]["lm loss"]
    assert records[2]["lm_loss"] < first_loss - 1  # it learns
    # segments 2 and 3 predicted the finish (2 after a resume): the page sets them against it
    check_the_page_of_a_finished_campaign(work, "rerun", [str(EXAMPLES), cfg])


def test_a_signalled_segment_is_resubmitted_and_continues_by_itself(text_workdir):
    """SIGTERM to the engine (what a preemption or Slurm's --signal sends) 3 iterations
    into a 60-iteration segment: the engine saves and stops, the segment fails with class
    ``signal``, and Snakemake's second attempt resumes it to the end in the same run."""
    work = text_workdir
    keep = {"last": 2, "every": 20}  # retention while the segment runs and after it
    cfg = write_config(
        work, "again", tiny(segments=1, iterations_per_segment=60, keep_checkpoints=keep)
    )
    engine_log = work / "logs/train_segment/again/seg1.engine.log"
    args = ["results/train/again/seg1.json", "--profile", "profiles/local", "--configfile", cfg]
    proc = subprocess.Popen(
        snakemake_cmd(work, *args), cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    wait_for_log(proc, engine_log, "iteration        3/")
    for pid in engine_pids(work, "checkpoints/again"):
        os.kill(pid, signal.SIGTERM)
    out = proc.communicate(timeout=hang_guard(40))[0].decode()  # retry to the end: ~40 s
    assert proc.returncode == 0, out[-5000:]
    assert "Trying to restart job" in out
    first, second = json.loads((work / "logs/train_segment/again/seg1.attempts.json").read_text())
    assert (first["attempt"], first["failure"]) == (1, "signal")
    assert 3 <= first["reached_iteration"] < 60
    assert (second["attempt"], second["failure"], second["reached_iteration"]) == (2, None, 60)
    record = json.loads((work / "results/train/again/seg1.json").read_text())
    assert record["resumed_from_iteration"] == first["reached_iteration"]
    # evaluation at the segment's end, TensorBoard scalars, the loss curve's inputs
    text = engine_log.read_text()
    assert re.search(r"validation loss at iteration 60 \| lm loss value: \S+ \| lm loss PPL:", text)
    events = list((work / "checkpoints/again/tensorboard").glob("events.out.tfevents.*"))
    assert events
    tags = tensorboard_tags(work / "checkpoints/again/tensorboard")
    assert {"lm loss", "lm loss validation", "learning-rate", "grad-norm", "throughput",
            "tokens-per-second", "consumed-tokens"} <= tags, tags  # fmt: skip
    # the index cache was built by its own job; the segment only loaded it
    assert "Build and save" not in text and "Load the GPTDataset train indices" in text
    cache = json.loads((work / "data/index_cache/again.json").read_text())
    assert cache["samples"]["train"] == 60 * 8 and cache["files"]
    from hpcllm.training.checkpoints.tracker import iteration_dirs

    # kept: the newest 2 committed (58, 60) and every 20th; the rest deleted by the segment
    assert iteration_dirs(work / "checkpoints/again") == [20, 40, 58, 60]
    assert (
        "keep_checkpoints: deleted iterations"
        in (work / "logs/train_segment/again/seg1.log").read_text()
    )


def tensorboard_tags(folder: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return set(acc.Tags()["scalars"])


def test_a_deterministic_failure_is_not_retried(text_workdir):
    """A partial checkpoint (the tracker names a folder without its model file): the
    engine refuses it, the first attempt fails with checkpoint_error, and the second is
    refused at once, naming the class, without launching the engine."""
    work = text_workdir
    cfg = write_config(work, "broken", tiny(segments=1))
    (work / "checkpoints/broken/iter_0000002").mkdir(parents=True)
    (work / "checkpoints/broken/latest_checkpointed_iteration.txt").write_text("2\n")
    proc = run_snakemake(
        work,
        "results/train/broken/seg1.json",
        "--profile",
        "profiles/local",
        "--configfile",
        cfg,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    log = (work / "logs/train_segment/broken/seg1.log").read_text()
    # Snakemake resubmits (retries are per rule), and each later attempt only reports
    assert "Trying to restart job" in out
    assert "not run: attempt 1" in log and "failed with checkpoint_error" in log, log
    assert (work / "logs/train_segment/broken/seg1.engine.log").read_text().count("==>") == 1
    entries = json.loads((work / "logs/train_segment/broken/seg1.attempts.json").read_text())
    assert [(e["attempt"], e["failure"]) for e in entries] == [(1, "checkpoint_error")]


def test_split_without_documents_fails_the_index_cache_job_with_its_reason(text_workdir):
    """Caught by the CPU job that builds the index cache, before any segment starts."""
    cfg = write_config(
        text_workdir,
        "nosplit",
        tiny(
            segments=1,
            data={"tokenizer": "sample_bpe", "sources": {"fineweb": 1.0}, "split": "949,50,1"},
        ),
    )
    proc = run_snakemake(
        text_workdir,
        "results/train/nosplit/seg1.json",
        "--profile",
        "profiles/local",
        "--configfile",
        cfg,
        check=False,
    )
    assert proc.returncode != 0
    log = (text_workdir / "logs/prepare_data_cache/nosplit.log").read_text()
    assert "gives the test split none of them" in log
    assert not (text_workdir / "logs/train_segment/nosplit").exists()


@pytest.mark.parametrize(
    ("experiment", "message"),
    [
        (tiny(preset="gpt5"), "'gpt5' does not exist"),
        (tiny(layout={"nodes": 1, "procs_per_node": 1, "tp": 2}), "data parallel only"),
        (tiny(batch={"micro": 3, "global": 8}), "global batch 8 is not divisible"),
        (tiny(data={"tokenizer": "sample_bpe", "sources": {"nowhere": 1.0}}), "'nowhere' is not in text.sources"),
        (tiny(data={"tokenizer": "other", "sources": {"sample_en": 1.0}}), "'other' is not in text.tokenizers"),
        (tiny(data={"tokenizer": "sample_bpe", "sources": {"sample_en": 1.0}, "split": "99,0,1"}), "gives the validation split no share"),
        (tiny(segments=1, iterations_per_segment=2), "(optim.warmup_iters = 2) is not shorter than the whole run"),
    ],
)  # fmt: skip
def test_bad_experiments_are_refused_at_plan_time(text_workdir, experiment, message):
    cfg = write_config(text_workdir, "bad", experiment)
    proc = run_snakemake(
        text_workdir, "-n", "--profile", "profiles/local", "--configfile", cfg, check=False
    )
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr


def test_status_of_a_half_finished_campaign_and_of_one_never_started(text_workdir):
    """`hpcllm status` (no Snakemake, no Slurm here) after segment 1 of 2 ran."""
    work = text_workdir
    path = work / "campaign.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "training": {
                    "experiments": {
                        "campaign": tiny(segments=2, iterations_per_segment=4),
                        "later": tiny(segments=2, iterations_per_segment=4),
                    }
                }
            }
        )
    )
    run_snakemake(
        work,
        "results/train/campaign/seg1.json",
        "--profile",
        "profiles/local",
        "--configfile",
        str(path),
    )
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "hpcllm"), "status", "-d", str(work),
         "--configfile", str(EXAMPLES), str(path), "--profile", "profiles/local"],
        capture_output=True, text=True, timeout=hang_guard(10), cwd=work,  # ~10 s quiet
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    tokens = 4 * 8 * 64 / 1e6  # iterations x global batch x sequence length
    assert f"campaign: 1/2 segments, checkpoint iteration 4/8 ({tokens:.3f} M tokens)" in out, out
    assert re.search(
        r"loss \d+\.\d{4} \(validation \d+\.\d{4}\), last segment [\d,]+ tokens/s", out
    )
    assert re.search(
        r"\d+\.\d\d GPU-hours spent, about \d+\.\d\d to finish \(about [\d.]+ (s|min|h) of "
        r"training at the last segment's speed, queue time not included\); jobs: none",
        out,
    ), out
    # when it will finish: no job of it runs or waits and no Snakemake run works in the
    # folder, so nothing carries it on: stalled, no date, the command that continues it
    # (issue 48; a running campaign's date: test_status.py and the Slurm calendar test)
    stalled = [x.strip() for x in out.splitlines() if x.strip().startswith("stalled")]
    assert len(stalled) == 3, out  # the example's tiny_local, campaign and later
    for line in stalled:
        assert line.startswith(
            "stalled (no date): no job of it is running or queued and no Snakemake run "
            f"works in {work}; continue it with `snakemake --profile profiles/local "
            f"--configfile {EXAMPLES} {path}` in {work}"
        ), line
    assert "expected to finish" not in out, out
    assert "later: 0/2 segments, checkpoint iteration -/8 (0.000 M tokens)" in out, out
    assert "loss - (validation -), last segment - tokens/s" in out
