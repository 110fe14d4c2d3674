"""pack_lmdb's job as the rule runs it: ``python -m hpcllm.vision.pack_job`` in a fresh
Python, with odd paths, bad input and the imports a job pays for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, hang_guard
from vision_helpers import expected_labels

from hpcllm.offline import OFFLINE_ENV
from hpcllm.vision import pack_job
from hpcllm.vision.lmdb_dataset import LMDBImageDataset
from hpcllm.vision.pack_job import parse_args
from hpcllm.vision.sample_data import write_sample_tree

# Quotes, backticks, a space, non-ASCII; the outputs' also a variable (a dataset's root
# expands them: $HPCLLM_IMAGENET_ROOT).
ODD = 'it\'s a "tree" `x` é'


def run_job(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, "-m", "hpcllm.vision.pack_job", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=hang_guard(60),
    )


def job_args(root: Path, out: Path, vision: dict | None = None) -> list[str]:
    """The arguments as the rule passes them: the params' Python literals, paths as is;
    the outputs' folder made, as Snakemake does."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = {"layout": "imagenet", "root": str(root), "splits": ["train"]}
    return [
        "--dataset", "mine", "--dataset-config", repr(cfg), "--vision", repr(vision or {}),
        "--split", "train", "--lmdb", str(out / "train.lmdb"),
        "--report", str(out / "train.report.json"), "--log", str(out / "train.log"),
        "--threads", "2",
    ]  # fmt: skip


def test_the_job_packs_a_split_at_odd_paths(tmp_path):
    root = write_sample_tree(
        tmp_path / ODD / "images", "imagenet", classes=2, train_per_class=3, val_per_class=1
    )
    out = tmp_path / f"out $HOME {ODD}"
    proc = run_job(*job_args(root, out))
    assert proc.returncode == 0, proc.stderr
    assert "pack train.lmdb: 6 of 6 images (100.0%)" in proc.stderr  # the progress lines
    ds = LMDBImageDataset(out / "train.lmdb")
    expected = expected_labels(root, "imagenet", "train", "loc_solution_csv")
    assert ds.num_samples == len(expected) == 6
    for i in range(ds.num_samples):
        data, label, name = ds.read_record(i)
        assert data == (root / name).read_bytes() and ds.classes[label] == expected[name]
    report = json.loads((out / "train.report.json").read_text())
    assert report["root"] == str(root) and report["dataset"] == "mine"
    assert report["num_samples"] == 6 and report["check"] == "header"
    assert "packed 6 images" in (out / "train.log").read_text()


def test_a_bad_image_fails_the_job_with_the_message_and_skip_leaves_it_out(tmp_path):
    root = write_sample_tree(
        tmp_path / ODD, "imagenet", classes=2, train_per_class=2, val_per_class=1
    )
    bad = next((root / "train").glob("*/*_1.JPEG"))
    bad.write_bytes(bad.read_bytes()[:300])
    out = tmp_path / "out"
    proc = run_job(*job_args(root, out))
    assert proc.returncode == 1
    log = out / "train.log"
    # the message on the terminal, the traceback in the log only
    assert f"BadInputError: 1 bad image:\n  {bad}" in proc.stderr
    assert f"(traceback in {log})" in proc.stderr and "Traceback" not in proc.stderr
    assert "Traceback" in log.read_text() and str(bad) in log.read_text()
    assert not (out / "train.lmdb").exists() and not (out / "train.report.json").exists()

    proc = run_job(*job_args(root, out, {"on_bad_image": "skip"}))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "train.report.json").read_text())
    assert [s["path"] for s in report["skipped"]] == [str(bad)] and report["num_samples"] == 3


def test_the_params_are_read_as_the_rule_writes_them_or_as_json():
    base = ["--dataset", "d", "--split", "val", "--lmdb", "l", "--report", "r", "--log", "g"]
    cfg = {"root": "/a b/it's", "layout": "imagenet", "splits": ["val"], "sample": None}
    assert parse_args([*base, "--dataset-config", repr(cfg)]).dataset_config == cfg
    assert parse_args([*base, "--dataset-config", json.dumps(cfg)]).dataset_config == cfg
    assert parse_args([*base, "--dataset-config", "{}"]).vision == {}


@pytest.mark.parametrize("text, problem", [("[1, 2]", "not a dict"), ("{'a': ", "neither")])
def test_a_malformed_param_names_the_option(text, problem, capsys):
    base = ["--dataset", "d", "--split", "val", "--lmdb", "l", "--report", "r", "--log", "g"]
    with pytest.raises(SystemExit) as exit_:
        parse_args([*base, "--dataset-config", text])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --dataset-config" in err and problem in err


def test_the_job_imports_only_what_it_uses():
    """A job per split pays its imports: no numpy (only the sample generator uses it), no
    subprocess (ctypes.util ran ldconfig), no PyYAML or Snakemake, nothing heavy."""
    code = (
        "import sys, json, runpy\n"
        "sys.argv = ['pack_job', '--help']\n"
        "try:\n    runpy.run_module('hpcllm.vision.pack_job', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = set(json.loads(proc.stdout.splitlines()[-1]))
    assert {"hpcllm", "lmdb", "PIL"} <= modules  # the imports ran
    unused = {"numpy", "subprocess", "yaml", "snakemake", "torch", "pandas", "jsonschema"}
    assert not unused & modules, unused & modules


def test_the_job_goes_offline_before_it_packs(monkeypatch, tmp_path):
    """A compute job (issue 21): the Hugging Face offline variables are set before the
    pack (tests/workflow/test_job_scripts.py checks the script: rules)."""
    for name in OFFLINE_ENV:
        monkeypatch.delenv(name, raising=False)
    seen = {}

    def pack(*args, **kwargs):
        seen.update({name: os.environ.get(name) for name in OFFLINE_ENV})

    monkeypatch.setattr(pack_job, "pack_dataset_split", pack)
    # not this process's logging and excepthook: the job's own
    monkeypatch.setattr(pack_job.logs, "setup", lambda path: seen.update(log=path))
    pack_job.main(job_args(tmp_path / "tree", tmp_path))
    assert seen == {**OFFLINE_ENV, "log": str(tmp_path / "train.log")}
