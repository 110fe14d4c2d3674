"""The export rule through Snakemake: a tiny torch campaign of 2 segments exports both
segments' checkpoints (export.segments: [1, last]); a change of the export settings
reruns the exports alone, a rerun segment only the export of its checkpoint, a changed
experiment its segments and then the exports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support import make_workdir, planned, run_snakemake

pytestmark = pytest.mark.workflow

NAME = "export_tiny"
EXPORTS = [f"results/export/{NAME}/iter_{it:07d}/export.json" for it in (2, 4)]


def configure(work: Path, **export) -> str:
    experiment = {
        "engine": "torch",
        "preset": "tiny",
        "data": {"tokenizer": "sample_bpe", "sources": {"sample_en": 1.0}, "split": "98,2,0"},
        "layout": {"nodes": 1, "procs_per_node": 1},
        "segments": 2,
        "iterations_per_segment": 2,
        "save_interval": 2,
        "eval_iters": 0,
        "export": {"segments": [1, "last"], **export},
    }
    path = work / "export.yaml"
    path.write_text(yaml.safe_dump({"training": {"experiments": {NAME: experiment}}}))
    return str(path)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    work = make_workdir(tmp_path_factory.mktemp("export") / "work")
    run_snakemake(work, *EXPORTS, "--profile", "profiles/local", "--configfile", configure(work))
    return work


def test_each_named_segment_is_exported_and_loads(exported):
    import torch
    import transformers

    for it, export in zip((2, 4), EXPORTS, strict=True):
        info = json.loads((exported / export).read_text())
        assert info["iteration"] == it and info["experiment"] == NAME
        assert info["source_checkpoint"] == f"checkpoints/{NAME}/iter_{it:07d}"
        # the data the model trained on, as its segment's record names it
        segment = json.loads((exported / f"results/train/{NAME}/seg{it // 2}.json").read_text())
        assert info["data_digest"] == segment["data_digest"] is not None
        folder = (exported / export).parent
        model = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
        tok = transformers.AutoTokenizer.from_pretrained(str(folder))
        ids = tok("The quick brown fox", return_tensors="pt")["input_ids"]
        assert torch.isfinite(model(input_ids=ids).logits).all()


def test_reruns_follow_what_changed(exported):
    work = exported
    args = (*EXPORTS, "--profile", "profiles/local", "-n")
    same = run_snakemake(work, *args, "--configfile", configure(work))
    assert "Nothing to be done" in same.stdout + same.stderr
    # other export settings: both exports, nothing else
    dtype = run_snakemake(work, *args, "--configfile", configure(work, dtype="bfloat16"))
    assert planned(dtype.stdout + dtype.stderr) == {"export_model": 2}
    # a new checkpoint of segment 2: its export, not segment 1's
    seg2 = run_snakemake(
        work,
        *args,
        "--configfile",
        configure(work),
        "--forcerun",
        f"results/train/{NAME}/seg2.json",
    )
    out = seg2.stdout + seg2.stderr
    assert planned(out) == {"train_segment": 1, "export_model": 1}
    assert f"output: {EXPORTS[1]}" in out and f"output: {EXPORTS[0]}" not in out
    # a changed experiment: its segments, then both exports
    path = Path(configure(work))
    cfg = yaml.safe_load(path.read_text())
    cfg["training"]["experiments"][NAME]["optim"] = {"lr": 0.002}
    path.write_text(yaml.safe_dump(cfg))
    changed = run_snakemake(work, *args, "--configfile", str(path))
    jobs = planned(changed.stdout + changed.stderr)
    assert jobs.get("train_segment") == 2 and jobs.get("export_model") == 2


def test_a_segment_the_experiment_lacks_is_refused_at_plan_time(tmp_path):
    work = make_workdir(tmp_path / "work")
    path = Path(configure(work))
    cfg = yaml.safe_load(path.read_text())
    cfg["training"]["experiments"][NAME]["export"]["segments"] = [3]
    path.write_text(yaml.safe_dump(cfg))
    proc = run_snakemake(work, "-n", "--configfile", str(path), check=False)
    assert proc.returncode != 0
    assert f"training.experiments.{NAME}.export.segments: 3 is not one of its segments 1..2" in (
        proc.stdout + proc.stderr
    )
