"""Issue 51 item 9: a ``model.vocab_size`` other than the tokenizer's is refused at plan
time (prepare_experiment, which the workflow's plan calls), naming the key, the
tokenizer's size and where that size comes from."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from hpcllm.clusters import load_cluster
from hpcllm.training.plan.experiment import prepare_experiment

REPO = Path(__file__).resolve().parents[2]


def experiment(vocab_size) -> dict:
    raw = yaml.safe_load((REPO / "config/experiments/opengptx_800m.yaml").read_text())
    exp = copy.deepcopy(raw["training"]["experiments"]["opengptx_800m"])
    exp["data"]["tokenizer"] = "bpe"
    exp["time"] = {"limit_minutes": None, "margin_seconds": 900, "signal_seconds": 600}
    exp["model"] = {"vocab_size": vocab_size}  # the rest: the preset's
    return exp


def text(**tokenizer) -> dict:
    return {
        "sources": {"fineweb": {"type": "local"}},
        "tokenizers": {"bpe": {"type": "train", **tokenizer}},
        "tokenize": {"tokenizers": ["bpe"]},
    }


def prepare(exp: dict, text: dict, workdir: Path):
    cluster = load_cluster("juwels", REPO / "config/clusters", environ={"HPCLLM_SCRATCH": "/s"})
    return prepare_experiment("opengptx_800m", exp, text, cluster, str(workdir))


def test_a_model_vocab_size_below_the_configured_tokenizers_is_refused(tmp_path):
    with pytest.raises(ValueError) as refused:
        prepare(experiment(100), text(vocab_size=8000), tmp_path)
    message = str(refused.value)
    assert "training.experiments.opengptx_800m.model.vocab_size: 100" in message, message
    assert "'bpe' has 8000 tokens (text.tokenizers.bpe.vocab_size)" in message, message
    assert "model.vocab_size: null" in message, message


def test_the_tokenizers_own_files_give_its_size_once_they_exist(tmp_path):
    """A trained tokenizer can come out smaller than asked: its vocab.json decides."""
    folder = tmp_path / "data/tokenizers/bpe"
    folder.mkdir(parents=True)
    vocab = {f"t{i}": i for i in range(299)} | {"<|endoftext|>": 299}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(ValueError, match="'bpe' has 300 tokens \\(data/tokenizers/bpe/vocab"):
        prepare(experiment(8000), text(vocab_size=8000), tmp_path)
    prepare(experiment(300), text(vocab_size=8000), tmp_path)  # the files' size: planned
    prepare(experiment(384), text(vocab_size=8000), tmp_path)  # the same once padded


def test_no_model_vocab_size_or_the_tokenizers_plans(tmp_path):
    prepare(experiment(None), text(vocab_size=8000), tmp_path)
    prepare(experiment(8000), text(vocab_size=8000), tmp_path)
    prepare(experiment(100), text(), tmp_path)  # the tokenizer's size not known yet
