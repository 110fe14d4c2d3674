"""train_tokenizer itself: sampling, limits, empty corpus, vocabulary size, special tokens."""

from __future__ import annotations

import json

import pytest

from hpcllm.text.sample_corpus import write_jsonl_zst
from hpcllm.text.tokenization import load_tokenizer
from hpcllm.text.tokenizer_train import sample_texts, train_bpe


def shards(tmp_path, per_shard: list[int]):
    paths = []
    for k, n in enumerate(per_shard):
        path = tmp_path / f"{k:04d}.jsonl.zst"
        write_jsonl_zst(((f"{k}-{i}", f"shard {k} doc {i}") for i in range(n)), path)
        paths.append(path)
    return paths


def test_the_sample_takes_the_first_documents_of_every_shard_in_turn(tmp_path):
    paths = shards(tmp_path, [10, 10, 10])
    assert list(sample_texts(paths, 6)) == [
        f"shard {k} doc {i}" for k in range(3) for i in range(2)
    ]
    # A short shard gives what it has; the limit is never exceeded; all when it is large.
    (tmp_path / "s").mkdir()
    short = shards(tmp_path / "s", [1, 10])
    assert list(sample_texts(short, 6)) == ["shard 0 doc 0"] + [
        f"shard 1 doc {i}" for i in range(3)
    ]
    assert len(list(sample_texts(paths, 1000))) == 30
    assert len(list(sample_texts(paths, 2))) <= 2


def test_an_empty_corpus_is_an_error_naming_the_shards(tmp_path):
    paths = shards(tmp_path, [0, 0])
    with pytest.raises(
        ValueError, match=r"no documents to train the tokenizer on in .*0000\.jsonl\.zst"
    ):
        train_bpe(paths, tmp_path / "out", vocab_size=300, special_tokens=["<|endoftext|>"])
    assert not (tmp_path / "out" / "tokenizer.json").exists()


def test_vocabulary_size_and_special_token_ids(tmp_path, sample_texts):
    corpus = tmp_path / "c.jsonl.zst"
    write_jsonl_zst(((str(i), t) for i, t in enumerate(sample_texts[:150])), corpus)
    specials = ["<|endoftext|>", "<pad>", "<|im_start|>"]
    train_bpe([corpus], tmp_path / "bpe", vocab_size=1000, special_tokens=specials)
    tok = load_tokenizer(tmp_path / "bpe" / "tokenizer.json")
    assert tok.get_vocab_size() == 1000
    # The special tokens come first, in the configured order, in every saved form.
    assert [tok.token_to_id(t) for t in specials] == [0, 1, 2]
    vocab = json.loads((tmp_path / "bpe" / "vocab.json").read_text())
    assert [vocab[t] for t in specials] == [0, 1, 2] and len(vocab) == 1000
    merges = (tmp_path / "bpe" / "merges.txt").read_text().splitlines()
    assert len([m for m in merges if not m.startswith("#")]) == 1000 - len(specials) - 256


def test_train_bpe_needs_an_end_of_document_token(tmp_path):
    with pytest.raises(ValueError, match="at least the end-of-document special token"):
        train_bpe(shards(tmp_path, [3]), tmp_path / "o", vocab_size=300, special_tokens=[])


def test_training_reports_documents_done_rate_and_time_left(
    tmp_path, sample_texts, monkeypatch, caplog
):
    """Issue 51 item 2: train_tokenizer logged only its start and end. Now reading the
    sample and the trainer's pass over it report documents done of all, the rate and the
    time left (as tokenize does), and the merges the time they took."""
    import logging
    import re

    import hpcllm.progress

    monkeypatch.setattr(hpcllm.progress, "INTERVAL_S", 0.0)  # a line at every update
    corpus = tmp_path / "c.jsonl.zst"
    texts = (sample_texts * 8)[:1200]
    write_jsonl_zst(((str(i), t) for i, t in enumerate(texts)), corpus)
    with caplog.at_level(logging.INFO):
        train_bpe([corpus], tmp_path / "bpe", vocab_size=400, special_tokens=["<|endoftext|>"],
                  sample_documents=1000)  # fmt: skip
    lines = caplog.messages
    reading = [m for m in lines if m.startswith("train_tokenizer: reading the sample: ")]
    assert "256 of 1,000 documents (25.6%)" in reading[0], reading
    assert re.search(
        r"1,000 of 1,000 documents \(100\.0%\), [\d.,]+ documents/s, done in", reading[-1]
    )
    counting = [m for m in lines if m.startswith("train_tokenizer: counting words: ")]
    assert any(re.search(r"of 1,000 documents \(\d+\.\d%\), [\d.,]+ documents/s, ETA ", m)
               for m in counting), counting  # fmt: skip
    assert counting[-1].startswith("train_tokenizer: counting words: 1,000 of 1,000 documents")
    assert any(re.fullmatch(r"train_tokenizer: merges learned in \d+:\d\d:\d\d", m) for m in lines)
