"""A language benchmark point on real tokenized text, not mock data: the shipped sample
corpus, tokenized by a real BPE into the Megatron format, trained on by the point's engine."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import yaml
import zstandard
from support import REPO, megatron_hf_tokenizer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from hpcllm.bench.language import run_language_point
from hpcllm.bench.logparse import parse_megatron_log
from hpcllm.bench.sweeps import ClusterFacts, expand_experiment
from hpcllm.clusters import load_cluster
from hpcllm.text.indexed_dataset import IndexedDatasetWriter

VOCAB = 1000


def sample_texts(n: int) -> list[str]:
    texts = []
    with open(REPO / "resources/sample_text/en.jsonl.zst", "rb") as f:
        reader = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(f), encoding="utf-8")
        for line in reader:
            texts.append(json.loads(line)["text"])
            if len(texts) == n:
                break
    return texts


def test_language_point_trains_on_real_tokenized_data(tmp_path):
    texts = sample_texts(300)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"])
    )
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    eod = tok.token_to_id("<|endoftext|>")
    prefix = tmp_path / "sample_en_text_document"
    with IndexedDatasetWriter(prefix, np.uint16) as w:
        for text in texts:
            w.add_document(tok.encode(text).ids + [eod])

    spec = yaml.safe_load((REPO / "config/examples/local.yaml").read_text())
    spec = spec["benchmarks"]["experiments"]["language_tiny"]
    spec.update(data=str(prefix), tokenizer=str(tmp_path / "tok" / "tokenizer.json"))
    point = next(
        p.row()
        for p in expand_experiment("language_tiny", spec, ClusterFacts("local", 0))
        if p.nodes == 1 and p.scaling == "strong"
    )
    run = tmp_path / "run"
    run.mkdir()
    local = load_cluster("local", root=REPO / "config" / "clusters")
    record = run_language_point(point, str(run / "run.log"), str(run / "run.json"), local)
    assert record["status"] == "ok", (run / "run.log").read_text()[-3000:]
    argv = record["command"]
    assert argv[argv.index("--data-path") + 1] == str(prefix) and "--mock-data" not in argv
    log = parse_megatron_log(run / "run.log")
    assert [i.iteration for i in log.iterations] == list(range(1, point["iterations"] + 1))
    # the model's output layer is this tokenizer's (loss starts near ln 1000, not at the
    # ln 50257 of mock data's GPT-2 vocabulary) and it learns from the text
    first, last = log.iterations[0].lm_loss, log.iterations[-1].lm_loss
    assert abs(first - math.log(VOCAB)) < 0.7 and first < math.log(50257) - 2
    assert last < first
    assert any((run / "index-cache").rglob("*")), "Megatron's dataset index was not built"


def test_megatron_reads_the_points_tokenizer_folder_with_its_end_of_document_token(tmp_path):
    """The folder a megatron point passes as --tokenizer-model loads in Megatron Core's
    tokenizer (as Megatron-LM builds HuggingFaceTokenizer) with EOD = the tokenizer's
    <|endoftext|> id: without an eos_token, Megatron's GPT datasets fail at start-up."""
    from hpcllm.bench.language import tokenizer_folder

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        sample_texts(50), trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"])
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    folder = tokenizer_folder({"tokenizer": str(tmp_path / "tokenizer.json")}, tmp_path / "run")
    real = megatron_hf_tokenizer(folder)
    assert real.eod == tok.token_to_id("<|endoftext|>")

    other = Tokenizer(models.BPE())
    other.train_from_iterator(sample_texts(20), trainers.BpeTrainer(vocab_size=300))
    other.save(str(tmp_path / "no_eod.json"))
    with pytest.raises(ValueError, match=r"no_eod.json: has no end-of-document token"):
        tokenizer_folder({"tokenizer": str(tmp_path / "no_eod.json")}, tmp_path / "run2")


def unigram(texts: list[str], vocab_size: int) -> Tokenizer:
    """A SentencePiece-style Unigram (NFKC, Metaspace) whose end-of-document token is </s>."""
    from tokenizers import normalizers

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        texts,
        trainers.UnigramTrainer(
            vocab_size=vocab_size,
            special_tokens=["<unk>", "<s>", "</s>"],
            unk_token="<unk>",
            show_progress=False,
        ),
    )
    return tok


def test_a_unigram_point_trains_with_its_end_of_document_token(tmp_path):
    """A non-BPE tokenizer.json (Unigram, EOD </s>) through the benchmark: the experiment's
    eod_token reaches both engines' tokenizer folder; the torch engine trains on the data
    it tokenized; Megatron Core's tokenizer of the megatron point's folder has that EOD."""
    from hpcllm.bench.language import engine_command

    texts = sample_texts(120)
    tok = unigram(texts, 600)
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    eod = tok.token_to_id("</s>")
    prefix = tmp_path / "uni_text_document"
    with IndexedDatasetWriter(prefix, np.uint16) as w:
        for text in texts:
            w.add_document(tok.encode(text).ids + [eod])
    spec = yaml.safe_load((REPO / "config/examples/local.yaml").read_text())
    spec = spec["benchmarks"]["experiments"]["language_tiny"]
    spec.update(data=str(prefix), tokenizer=str(tmp_path / "tok" / "tokenizer.json"))
    points = expand_experiment("language_tiny", spec, ClusterFacts("local", 0))
    point = next(p.row() for p in points if p.nodes == 1 and p.scaling == "strong")
    assert "eod_token" not in point  # a point of an experiment that does not set it
    with pytest.raises(ValueError, match=r"set benchmarks.experiments.language_tiny.eod_token"):
        engine_command(point, tmp_path / "refused", "python")
    spec["eod_token"] = "</s>"
    points = expand_experiment("language_tiny", spec, ClusterFacts("local", 0))
    point = next(p.row() for p in points if p.nodes == 1 and p.scaling == "strong")
    run = tmp_path / "run"
    run.mkdir()
    local = load_cluster("local", root=REPO / "config" / "clusters")
    record = run_language_point(point, str(run / "run.log"), str(run / "run.json"), local)
    assert record["status"] == "ok", (run / "run.log").read_text()[-3000:]
    argv = record["command"]
    assert argv[argv.index("--eod-token") + 1] == "</s>" and "--vocab-file" not in argv
    log = parse_megatron_log(run / "run.log")
    assert [i.iteration for i in log.iterations] == list(range(1, point["iterations"] + 1))
    first = log.iterations[0].lm_loss
    assert abs(first - math.log(600)) < 0.7  # this tokenizer's output layer
    argv = engine_command({**point, "engine": "megatron"}, tmp_path / "m", "python")
    folder = argv[argv.index("--tokenizer-model") + 1]
    assert argv[argv.index("--tokenizer-type") + 1] == "HuggingFaceTokenizer"
    real = megatron_hf_tokenizer(folder)
    assert (real.eod, real.vocab_size) == (eod, tok.get_vocab_size(with_added_tokens=True))
