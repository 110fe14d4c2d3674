"""A smoke run of benchmarks/lmdb_pack.py on tiny data, so the benchmark does not rot."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from support import REPO, hang_guard


def test_lmdb_pack_benchmark_prints_the_ratio_to_tar_and_sync(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks/lmdb_pack.py"),
            "--images",
            "24",
            "--classes",
            "3",
            "--repeats",
            "1",
            "--reads",
            "6",
            "--work",
            str(tmp_path),
            "--compare-read-ahead",
            "--compare-writeback",
            "--job",
            "--compare-sizes",
            "64/128",
            "--snakemake-job",
            "--size",
            "64x48",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=hang_guard(60),  # ~40 s quiet (three Snakemake jobs: ~2 CPU-s each)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "tree: 24 images" in out
    assert (tmp_path / "imagenet24_64x48").is_dir()
    names = ("pack_lmdb", "pack, no read-ahead", "pack, no writeback", "pack_lmdb job")
    names += ("Snakemake job",)
    for name in (*names, "job, 64/128 MB"):
        for what in ("ratio", "CPU ratio"):
            ratio = re.search(
                rf"^{what} {re.escape(name)}/\(tar -cf \+ sync\): ([\d.]+)", out, re.M
            )
            assert ratio and float(ratio[1]) > 0, out
    assert re.search(
        r"^Snakemake job, -n .*the rule's part .*: -?[\d.]+ s, CPU -?[\d.]+ s$", out, re.M
    )
    assert len(re.findall(r"workers=\d: LMDB +\d+ +folder +\d+", out)) == 4, out
    assert not list(tmp_path.glob("out/*.tar"))  # the archive is removed
    # the Snakemake job ran the workflow's pack_lmdb rule on the generated tree
    case = tmp_path / "snakemake-case"
    report = json.loads((case / "data/vision/bench/train.report.json").read_text())
    assert report["num_samples"] == 24 and report["root"] == str(tmp_path / "imagenet24_64x48")
    assert "packed 24 images" in (case / "logs/pack_lmdb/bench/train.log").read_text()
