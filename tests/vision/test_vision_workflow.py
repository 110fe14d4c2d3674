"""pack_lmdb through Snakemake: the built-in samples, a user tree with bad input, plan-time errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support import REPO, run_snakemake
from vision_helpers import expected_labels

from hpcllm.vision.lmdb_dataset import LMDBImageDataset
from hpcllm.vision.sample_data import write_sample_tree

pytestmark = pytest.mark.workflow
SAMPLES = {"imagenet_sample": "imagenet", "tinyimagenet_sample": "tinyimagenet"}
USER_TREE = 'user\'s "images" `x` é'


def targets(datasets, splits=("train", "val")) -> list[str]:
    return [f"data/vision/{d}/{s}.lmdb" for d in datasets for s in splits]


def test_local_config_packs_the_sample_trees(workdir):
    run_snakemake(workdir, "--cores", "2", *targets(SAMPLES))
    for dataset, layout in SAMPLES.items():
        root = workdir / "data/vision/sample" / dataset
        for split in ("train", "val"):
            expected = expected_labels(root, layout, split, "loc_solution_csv")
            ds = LMDBImageDataset(workdir / f"data/vision/{dataset}/{split}.lmdb")
            assert ds.num_samples == len(expected) > 0
            for i in range(ds.num_samples):
                data, label, name = ds.read_record(i)
                assert data == (root / name).read_bytes() and ds.classes[label] == expected[name]
            report = json.loads(
                (workdir / f"data/vision/{dataset}/{split}.report.json").read_text()
            )
            assert report["num_samples"] == ds.num_samples and report["skipped"] == []
            assert (workdir / f"logs/pack_lmdb/{dataset}/{split}.log").is_file()
    assert not list((workdir / "data").rglob("*.incomplete"))
    proc = run_snakemake(workdir, "--cores", "2", "-n", *targets(SAMPLES))
    assert "Nothing to be done" in proc.stdout + proc.stderr
    # The job's Python and checkout are no recorded params: another venv or a moved
    # checkout does not make the packed splits out of date.
    records = [json.loads(p.read_text()) for p in (workdir / ".snakemake/metadata").iterdir()]
    packs = [r for r in records if r["rule"] == "pack_lmdb"]
    assert len(packs) == 8 and all(len(r["params"]) == 2 for r in packs), packs
    assert not [p for r in packs for p in r["params"] if str(REPO) in p], packs


def user_tree(workdir: Path) -> Path:
    """A user's ImageNet tree with one truncated image, in a folder whose name the job's
    shell command must quote; returns that image."""
    root = write_sample_tree(
        workdir / USER_TREE, "imagenet", classes=2, train_per_class=3, val_per_class=1
    )
    bad = next((root / "train").glob("*/*_1.JPEG"))
    bad.write_bytes(bad.read_bytes()[:300])
    return bad


def pack_user_tree(workdir: Path, on_bad_image: str, check: bool):
    mine = {"layout": "imagenet", "root": str(workdir / USER_TREE), "splits": ["train"]}
    config = {"vision": {"on_bad_image": on_bad_image, "datasets": {"mine": mine}}}
    (workdir / "mine.yaml").write_text(yaml.safe_dump(config))
    target = "data/vision/mine/train.lmdb"  # before --configfile, which takes several values
    return run_snakemake(workdir, "--cores", "2", target, "--configfile", "mine.yaml", check=check)


def test_user_tree_with_a_truncated_image_fails_or_skips(workdir):
    bad = user_tree(workdir)
    proc = pack_user_tree(workdir, "fail", check=False)
    assert proc.returncode != 0, proc.stdout
    assert str(bad) in (workdir / "logs/pack_lmdb/mine/train.log").read_text()
    assert not (workdir / "data/vision/mine").exists() or not list(
        (workdir / "data/vision/mine").iterdir()
    )
    pack_user_tree(workdir, "skip", check=True)
    report = json.loads((workdir / "data/vision/mine/train.report.json").read_text())
    assert [s["path"] for s in report["skipped"]] == [str(bad)] and report["num_samples"] == 5


def test_missing_tree_is_reported_in_a_dry_run(workdir):
    config = {
        "vision": {"datasets": {"real": {"layout": "imagenet", "root": str(workdir / "nowhere")}}}
    }
    (workdir / "real.yaml").write_text(yaml.safe_dump(config))
    proc = run_snakemake(
        workdir, "-n", *targets(["real"]), "--configfile", "real.yaml", check=False
    )
    assert proc.returncode != 0
    assert (
        "vision.datasets.real" in proc.stdout + proc.stderr
        and "nowhere: the dataset root not found" in proc.stdout + proc.stderr
    )
