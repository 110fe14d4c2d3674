"""Changing an experiment after a finished run (docs/training.md, "Changing an
experiment"): a weight-determining change plans its segments again and they refuse the old
checkpoint, naming the keys; a continuation-safe change continues the campaign; a forced
rerun on a checkpoint of other settings is refused; a corrupt checkpoint is named.

One finished 2-segment campaign (module fixture) is copied for each test."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from training_helpers import run_snakemake

pytestmark = pytest.mark.workflow

NAME = "chg"


def experiment(**overrides) -> dict:
    exp = {
        "engine": "torch",
        "preset": "tiny",
        "data": {"tokenizer": "sample_bpe", "sources": {"sample_en": 1.0}, "split": "98,2,0"},
        "layout": {"nodes": 1, "procs_per_node": 1},
        "segments": 2,
        "iterations_per_segment": 4,
        "save_interval": 2,
    }
    for key, value in overrides.items():
        section, _, sub = key.partition("__")
        if sub:
            exp[section] = {**exp.get(section, {}), sub: value}
        else:
            exp[key] = value
    return exp


def configure(work: Path, **overrides) -> str:
    path = work / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump({"training": {"experiments": {NAME: experiment(**overrides)}}}))
    return str(path)


def snakemake(work: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run_snakemake(
        work, f"results/train/{NAME}/seg2.json", "--profile", "profiles/local", *args, check=check
    )


@pytest.fixture(scope="module")
def finished(text_workdir, tmp_path_factory) -> Path:
    """A working directory whose campaign of 2 x 4 iterations is done."""
    work = tmp_path_factory.mktemp("changes") / "work"
    shutil.copytree(text_workdir, work, symlinks=True, ignore=_other_experiments)
    snakemake(work, "--configfile", configure(work))
    assert (work / f"results/train/{NAME}/seg2.json").exists()
    return work


def _other_experiments(folder: str, names: list[str]) -> list[str]:
    if Path(folder).name in ("checkpoints", "train", "train_segment", "index_cache"):
        return [n for n in names if not n.startswith(NAME)]
    return []


@pytest.fixture
def work(finished, tmp_path) -> Path:
    """A copy of the finished campaign (times kept, so nothing looks newer)."""
    copy = tmp_path / "work"
    shutil.copytree(finished, copy, symlinks=True)
    return copy


def snapshot(work: Path) -> dict[Path, int]:
    """Modification times of the records and checkpoint files."""
    files = [
        *(work / f"results/train/{NAME}").glob("*.json"),
        *(work / f"checkpoints/{NAME}").rglob("*.pt"),
    ]
    return {p: p.stat().st_mtime_ns for p in files}


def launches(work: Path, k: int) -> int:
    log = work / f"logs/train_segment/{NAME}/seg{k}.engine.log"
    return log.read_text().count("==> ") if log.exists() else 0


def planned(out: str) -> dict[str, int]:
    """Job counts of a dry run's job stats table."""
    table = out.split("Job stats:", 1)[1].split("total", 1)[0] if "Job stats:" in out else ""
    rows = (line.split() for line in table.splitlines())
    return {row[0]: int(row[1]) for row in rows if len(row) == 2 and row[1].isdigit()}


# the change, its key in the refusal, and whether the index cache is built again
WEIGHT_CHANGES = [
    ({"optim__lr": 0.002}, "optim.lr: 0.003 -> 0.002", False),
    ({"model__hidden_size": 128}, "model.hidden_size: 64 -> 128", False),
    (
        {"data": {"tokenizer": "sample_bpe", "sources": {"sample_en": 0.5, "fineweb": 0.5}, "split": "98,2,0"}},
        'data.blend: [["data/tokenized/sample_bpe/sample_en_text_document", 1.0]] -> '
        '[["data/tokenized/sample_bpe/fineweb_text_document", 0.5], '
        '["data/tokenized/sample_bpe/sample_en_text_document", 0.5]]',  # YAML sorts keys
        True,
    ),
    ({"seed": 7}, "seed: 1234 -> 7", True),
    ({"precision": "bf16"}, 'precision: "fp32" -> "bf16"', False),
]  # fmt: skip


@pytest.mark.parametrize(("change", "named", "cache"), WEIGHT_CHANGES)
def test_a_weight_determining_change_plans_the_segments_and_says_why(work, change, named, cache):
    proc = snakemake(work, "-n", "--configfile", configure(work, **change))
    out = proc.stdout + proc.stderr
    jobs = planned(out)
    assert jobs.get("train_segment") == 2, out[-3000:]
    assert ("prepare_data_cache" in jobs) == cache, jobs
    assert "Params have changed since last execution" in out
    # the warning names the key, old -> new, and the ways out
    assert named in out, out[-3000:]
    assert "give the changed experiment a new name" in out
    assert f"hpcllm restart-training {NAME}" in out


def test_the_changed_segment_refuses_the_old_checkpoint_then_a_restart_trains_afresh(work):
    before, engine_runs = snapshot(work), launches(work, 1)
    cfg = configure(work, optim__lr=0.002)
    proc = snakemake(work, "--configfile", cfg, check=False)
    assert proc.returncode != 0
    log = (work / f"logs/train_segment/{NAME}/seg1.log").read_text()
    assert "optim.lr: 0.003 -> 0.002" in log and "nothing was started" in log, log[-3000:]
    assert launches(work, 1) == engine_runs  # the engine never started
    # no checkpoint touched; the record Snakemake removed before the job is not written
    assert {p: t for p, t in snapshot(work).items() if p.suffix == ".pt"} == {
        p: t for p, t in before.items() if p.suffix == ".pt"
    }
    assert not (work / f"results/train/{NAME}/seg1.json").exists()
    entries = json.loads((work / f"logs/train_segment/{NAME}/seg1.attempts.json").read_text())
    assert entries[-1]["failure"] == "config_error"

    # the explicit way out: the checkpoints moved aside, the experiment trained afresh
    restart = subprocess.run(
        [str(Path(sys.executable).parent / "hpcllm"), "restart-training", NAME, "-d", str(work)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert restart.returncode == 0, restart.stderr
    (aside,) = (work / "checkpoints").glob(f"{NAME}.replaced-*")
    assert (aside / "iter_0000008").is_dir()
    snakemake(work, "--configfile", cfg)
    record = json.loads((work / f"results/train/{NAME}/seg1.json").read_text())
    assert record["resumed_from_iteration"] == 0
    settings = json.loads((work / f"checkpoints/{NAME}/training_settings.json").read_text())
    assert settings["weights"]["optim.lr"] == 0.002


def test_the_segments_records_survive_a_refused_change_and_a_forced_rerun(work):
    """Issue 40: Snakemake deletes seg1.json before the job that refuses a changed lr; the
    run with the lr back, and a --forcerun of seg1.json, find both segments trained and
    restore the records of the jobs that trained them (not seconds 0.0, resumed_from 8)."""
    results = work / f"results/train/{NAME}"
    trained = {k: (results / f"seg{k}.json").read_text() for k in (1, 2)}
    proc = snakemake(work, "--configfile", configure(work, optim__lr=0.002), check=False)
    assert proc.returncode != 0 and not (results / "seg1.json").exists()
    runs = launches(work, 1), launches(work, 2)
    snakemake(work, "--configfile", configure(work))
    assert {k: (results / f"seg{k}.json").read_text() for k in (1, 2)} == trained
    assert (launches(work, 1), launches(work, 2)) == runs  # no engine started


def test_a_forced_rerun_of_trained_segments_is_refused_with_the_command_that_trains(work):
    """Issue 40: a --forcerun of seg1.json (or of the data under it) over a checkpoint that
    holds both segments would train nothing and export the old model as new. The plan
    says so (a dry run warns) and a real run submits nothing, naming restart-training
    and the way to keep the model; the records and checkpoints stay as they were."""
    before = snapshot(work)
    force = ("--configfile", configure(work), "--forcerun", f"results/train/{NAME}/seg1.json")
    said = (
        f"training.experiments.{NAME}: segments 1 (forced (--forcerun, -R or -F)) are "
        f"planned again, but checkpoints/{NAME} holds iteration 8, past their targets"
    )
    dry = snakemake(work, *force, "-n")
    assert f"Warning: {said}" in dry.stdout + dry.stderr, (dry.stdout + dry.stderr)[-3000:]
    proc = snakemake(work, *force, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"Nothing was submitted: {said}" in out, out[-3000:]
    assert f"`hpcllm restart-training {NAME}`" in out and "--touch" in out
    assert snapshot(work) == before  # nothing ran, nothing was rewritten
    # README's own example: the data made again under the trained segments
    data = (
        "--configfile",
        configure(work),
        "--forcerun",
        "data/tokenized/sample_bpe/sample_en_text_document.bin",
    )
    dry = snakemake(work, *data, "-n")
    made = "(its data is made again in this run)"
    assert f"segments 1 {made}, 2 {made} are planned again" in dry.stdout + dry.stderr


def test_a_forced_rerun_on_a_checkpoint_of_other_settings_is_refused(work):
    """Without Snakemake's params trigger (only file times), forcing the last segment: it
    must not report the old checkpoint as trained with the new settings."""
    record = work / f"results/train/{NAME}/seg2.json"
    proc = snakemake(
        work,
        "--configfile",
        configure(work, model__hidden_size=128),
        "--rerun-triggers",
        "mtime",
        "--forcerun",
        f"results/train/{NAME}/seg2.json",
        check=False,
    )
    assert proc.returncode != 0
    log = (work / f"logs/train_segment/{NAME}/seg2.log").read_text()
    assert "model.hidden_size: 64 -> 128" in log and "nothing to train" not in log, log[-3000:]
    # Snakemake removed the forced job's output first; it was not written again
    assert not record.exists()


def test_a_longer_campaign_with_other_intervals_continues(work):
    """More segments and iterations, another save and eval interval: only the new segment
    runs, from the newest checkpoint."""
    before = snapshot(work)
    cfg = configure(work, segments=3, iterations_per_segment=5, save_interval=5, eval_interval=5)
    proc = run_snakemake(
        work, "-n", f"results/train/{NAME}/seg3.json", "--profile", "profiles/local",
        "--configfile", cfg,
    )  # fmt: skip
    assert planned(proc.stdout + proc.stderr) == {"train_segment": 1}, proc.stdout[-3000:]
    assert "Warning: training.experiments" not in proc.stdout + proc.stderr
    run_snakemake(
        work, f"results/train/{NAME}/seg3.json", "--profile", "profiles/local", "--configfile", cfg
    )
    record = json.loads((work / f"results/train/{NAME}/seg3.json").read_text())
    assert (record["resumed_from_iteration"], record["last_iteration"]) == (8, 15)
    assert {p: t for p, t in snapshot(work).items() if p in before} == before
    settings = json.loads((work / f"checkpoints/{NAME}/training_settings.json").read_text())
    assert settings["continuation"]["segments"] == 3


def test_a_corrupt_checkpoint_is_named_and_never_called_intact(work):
    model = work / f"checkpoints/{NAME}/iter_0000008/mp_rank_00/model_optim_rng.pt"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])  # a cut write
    cfg = configure(work, segments=3)
    proc = run_snakemake(
        work, f"results/train/{NAME}/seg3.json", "--profile", "profiles/local",
        "--configfile", cfg, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    log = (work / f"logs/train_segment/{NAME}/seg3.log").read_text()
    assert "intact" not in log
    # the checksums recorded at the commit name it before any engine would load it
    cut = f"{NAME}/iter_0000008/mp_rank_00/model_optim_rng.pt: {model.stat().st_size} bytes"
    assert cut in log and "would train on damaged weights" in log, log[-3000:]
    entries = json.loads((work / f"logs/train_segment/{NAME}/seg3.attempts.json").read_text())
    assert [e["failure"] for e in entries] == ["checkpoint_error"]  # not retried
