"""Passes over the data: stated at plan time, refused beyond data.max_passes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from support import REPO, make_workdir, run_snakemake

from hpcllm.text.indexed_dataset import IndexedDatasetWriter
from hpcllm.training.plan.data import Blend
from hpcllm.training.plan.passes import (
    SourceTokens,
    TooManyPasses,
    check_passes,
    files_tokens,
    passes_report,
)


def experiment(max_passes=10, split="90,10,0"):
    return {
        "segments": 2,
        "iterations_per_segment": 5,
        "model": {"seq_length": 100},
        "data": {"sources": {"a": 3, "b": 1}, "split": split, "max_passes": max_passes},
    }


def test_passes_count_each_source_by_its_blend_weight_and_train_share():
    # 2 x 5 iterations x global batch 4 x 100 = 4,000 tokens: 3,000 from a, 1,000 from b
    sources = {"a": SourceTokens(1_000, True), "b": SourceTokens(10_000, True)}
    line, problem = passes_report("x", experiment(), 4, sources)
    assert problem is None
    assert "a: 3,000 tokens over 1,000 (90% of them to train): 3.33 passes" in line
    assert "b: 1,000 tokens over 10,000 (90% of them to train): 0.11 passes" in line


def test_a_plan_over_max_passes_is_refused_naming_the_numbers_and_the_key():
    sources = {"a": SourceTokens(100, True), "b": SourceTokens(None, False)}
    line, problem = passes_report("x", experiment(), 4, sources)
    assert "b: size known once tokenized" in line
    assert problem.startswith("training.experiments.x plans 4,000 tokens, 33 passes over source a")
    assert "more than data.max_passes = 10" in problem
    assert "training.experiments.x.data.max_passes: 34" in problem
    assert passes_report("x", experiment(max_passes=34), 4, sources)[1] is None


def test_file_estimates_are_an_upper_bound_and_unknown_without_the_files(tmp_path):
    plain, packed = tmp_path / "a.jsonl", tmp_path / "b.jsonl.zst"
    plain.write_bytes(b"x" * 100)
    packed.write_bytes(b"x" * 10)
    assert files_tokens([str(plain), str(packed)]) == SourceTokens(140, False)
    assert files_tokens([str(tmp_path / "missing.parquet")]).tokens is None


def test_the_data_cache_job_checks_the_exact_tokens_of_the_merged_datasets(tmp_path):
    prefixes = []
    for name, docs in (("a", 3), ("b", 50)):
        prefix = str(tmp_path / f"{name}_text_document")
        with IndexedDatasetWriter(prefix, np.dtype(np.uint16)) as writer:
            for _ in range(docs):
                writer.add_document(range(10))  # 10 tokens a document
        prefixes.append(prefix)
    prepared = SimpleNamespace(
        experiment=experiment(),
        layout=SimpleNamespace(global_batch=4),
        blend=Blend(tuple(prefixes), None),
    )
    with pytest.raises(TooManyPasses, match="111 passes over source a \\(30 tokens\\)"):
        check_passes("x", prepared)
    prepared.experiment["data"]["max_passes"] = 200
    assert "b: 1,000 tokens over 500" in check_passes("x", prepared)


@pytest.mark.workflow
def test_the_800m_model_on_the_sample_data_is_refused_at_plan_time(tmp_path):
    """config/experiments/opengptx_800m.yaml over the laptop examples: 31 B tokens over a
    FineWeb mirror of a few hundred thousand: refused naming the passes, in a dry run."""
    workdir = make_workdir(tmp_path / "work")
    env = {"HPCLLM_ACCOUNT": "proj0042"}
    on_samples = workdir / "on_samples.yaml"  # the examples' tokenizer, max_passes unset
    on_samples.write_text(
        "training: {experiments: {opengptx_800m: {data: {tokenizer: sample_bpe}}}}\n"
    )
    args = ["-n", "--profile", "profiles/juwels", "--configfile"]
    args += ["config/experiments/opengptx_800m.yaml", str(on_samples)]
    proc = run_snakemake(workdir, *args, env=env, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "training.experiments.opengptx_800m plans 31,457,280,000 tokens" in out, out[-3000:]
    assert "passes over source fineweb" in out and "data.max_passes = 10" in out
    allowed = run_snakemake(
        workdir, *args, str(REPO / "tests/data/opengptx_on_samples.yaml"), env=env
    )
    assert "Passes over the data, opengptx_800m" in allowed.stdout + allowed.stderr
