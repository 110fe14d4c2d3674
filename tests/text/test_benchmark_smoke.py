"""The text benchmarks run end to end on tiny data, so they do not rot (figures not checked)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from support import REPO


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.workflow
def test_plan_scale_runs_on_a_tiny_plan(tmp_path, capsys):
    rows = load("plan_scale").main(["--shards", "8", "--workdir", str(tmp_path)])
    assert [r["shards"] for r in rows] == [8] and rows[0]["jobs"] == 20  # 2 per shard + 4
    assert rows[0]["ours_s"] > 0 and rows[0]["bare_s"] > 0 and rows[0]["ours_rss_mb"] > 0
    assert "ratio time" in capsys.readouterr().out


@pytest.mark.workflow
def test_job_overhead_runs_and_compares_a_revision(tmp_path, capsys):
    medians = load("job_overhead").main(
        ["--repeat", "1", "--workdir", str(tmp_path / "case"), "--compare", "HEAD"]
    )
    assert medians["workflow tokenize job, whole"] > medians["python -c pass"] > 0
    assert medians["the same, workflow at HEAD (-n)"] > 0
    assert medians["bare job, script: touching the outputs"] > 0
    out = capsys.readouterr().out
    assert "job process here / at HEAD" in out
    assert "bytecode: written and reused" in out


def skip_without_test_cluster() -> None:
    sys.path.insert(0, str(REPO / "tests" / "slurm"))
    import testcluster

    if testcluster.missing_requirements():
        pytest.skip(testcluster.missing_requirements())


@pytest.mark.slurm
def test_text_volume_runs_on_the_test_cluster(tmp_path):
    skip_without_test_cluster()
    result = load("text_volume").main(
        ["--gigabytes", "0.002", "--shards", "2", "--workdir", str(tmp_path)]
    )
    assert result["shards"] == 2 and result["tokens"] > 0
    assert result["stages"]["tokenize"]["jobs"] == 2
    assert result["stages"]["merge_tokenized"]["jobs"] == 1
    assert result["ratio_stage_to_bare_hf"] > 0


@pytest.mark.slurm
def test_fineweb_scale_runs_on_the_test_cluster(tmp_path):
    skip_without_test_cluster()
    result = load("fineweb_scale").main(
        ["--parquet-gigabytes", "0.004", "--files", "2", "--shards", "2", "--row-group-mb", "1"]
        + ["--workdir", str(tmp_path)]
    )
    # Several row groups per file, at least the Parquet asked for, FineWeb's columns.
    assert all(groups >= 2 for _, groups, _ in result["mirror"]["files"])
    assert result["mirror"]["parquet_bytes"] >= 0.004e9
    assert result["mirror"]["columns"][:2] == ["text", "id"]
    assert len(result["mirror"]["columns"]) == 9
    assert set(result["stages"]) == {"tokenize", "merge_tokenized"}
    assert result["stages"]["tokenize"]["jobs"] == 2 and result["stages"]["tokenize"]["span_s"] > 0
    # A job's span covers its benchmark's seconds (merge_tokenized logs one line, at its end).
    merge = result["stages"]["merge_tokenized"]
    assert merge["span_s"] >= merge["job_seconds_sum"] - 0.01 > 0
    assert result["tokens"] > 0 and result["ratio_end_to_end_to_bare"] > 0


def test_shard_cpu_runs_on_a_tiny_file(tmp_path, capsys):
    result = load("shard_cpu").main(
        ["--text-megabytes", "0.2", "--repeat", "1", "--workdir", str(tmp_path)]
    )
    assert result["medians"]["here"] > 0
    out = capsys.readouterr().out
    assert "4 shards / 1 shard, CPU, median of 1" in out
    assert "bytecode: written and reused" in out
