"""The train_segment chain through Snakemake: a failed segment reruns alone and resumes;
bad experiments are refused at plan time (dry run)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from training_helpers import run_snakemake, snakemake_cmd

pytestmark = pytest.mark.workflow


def write_config(workdir: Path, name: str, experiment: dict) -> str:
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"training": {"experiments": {name: experiment}}}))
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
        if b"hpcllm.training.torch_engine" in cmd and save.encode() in cmd and cwd == str(workdir):
            pids.append(int(entry.name))
    return pids


def test_failed_segment_reruns_alone_and_resumes(text_workdir):
    work = text_workdir
    cfg = write_config(work, "rerun", tiny())
    save = work / "checkpoints" / "rerun"
    engine_log = work / "logs/train_segment/rerun/seg2.engine.log"
    args = ["results/train/rerun/seg3.json", "--profile", "profiles/local", "--configfile", cfg]
    proc = subprocess.Popen(
        snakemake_cmd(work, *args), cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    deadline = time.time() + 300
    # Segment 2 trains iterations 7..12 and saves at 8: kill it (a node dying) after 9.
    while not (engine_log.exists() and "iteration        9/" in engine_log.read_text()):
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read().decode()
        time.sleep(0.1)
    pids = engine_pids(work, "checkpoints/rerun")
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    out = proc.communicate(timeout=300)[0].decode()
    assert proc.returncode != 0, out
    # The kill lands after iteration 9 was logged; on a busy machine the engine may
    # have saved a later checkpoint (every 2 iterations) before it died.
    from hpcllm.training.checkpoints import latest_iteration

    newest = latest_iteration(save)
    assert newest in (8, 10), newest
    assert (
        f"stopped at iteration {newest} of 12"
        in out + (work / "logs/train_segment/rerun/seg2.log").read_text()
    )
    seg1 = work / "results/train/rerun/seg1.json"
    assert seg1.exists() and not (work / "results/train/rerun/seg2.json").exists()
    kept = {p: p.stat().st_mtime_ns for p in [seg1, *sorted((save / "iter_0000006").rglob("*"))]}

    proc = run_snakemake(work, *args)
    assert "rule train_segment" in proc.stdout + proc.stderr
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # segment 1 not run again
    assert "loaded checkpoint from" in engine_log.read_text().split("==>")[-1]
    assert f"at iteration {newest}" in engine_log.read_text().split("==>")[-1]
    import json

    records = [
        json.loads((work / f"results/train/rerun/seg{k}.json").read_text()) for k in (1, 2, 3)
    ]
    assert [r["last_iteration"] for r in records] == [6, 12, 18]
    assert records[1]["resumed_from_iteration"] == newest
    assert records[2]["lm_loss"] < records[0]["lm_loss"]


@pytest.mark.parametrize(
    ("experiment", "message"),
    [
        (tiny(preset="gpt5"), "'gpt5' does not exist"),
        (tiny(layout={"nodes": 1, "procs_per_node": 1, "tp": 2}), "data parallel only"),
        (tiny(batch={"micro": 3, "global": 8}), "global batch 8 is not divisible"),
        (tiny(data={"tokenizer": "sample_bpe", "sources": {"nowhere": 1.0}}), "'nowhere' is not in text.sources"),
        (tiny(data={"tokenizer": "other", "sources": {"sample_en": 1.0}}), "'other' is not in text.tokenizers"),
    ],
)  # fmt: skip
def test_bad_experiments_are_refused_at_plan_time(text_workdir, experiment, message):
    cfg = write_config(text_workdir, "bad", experiment)
    proc = run_snakemake(
        text_workdir, "-n", "--profile", "profiles/local", "--configfile", cfg, check=False
    )
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr


def test_split_without_documents_fails_the_segment_with_its_reason(text_workdir):
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
    log = (text_workdir / "logs/train_segment/nosplit/seg1.log").read_text()
    assert "gives the test split none of them" in log
