"""Train a byte-level BPE tokenizer on a sample of the sources' shards (``train_tokenizer``).

Saved as ``tokenizer.json`` (for ``tokenizers``, gigatoken and Megatron's
``HuggingFaceTokenizer``) with a ``tokenizer_config.json`` that names the end-of-document
token as ``eos_token`` (Megatron's HuggingFaceTokenizer takes its EOD id from it, and its
datasets fail without one), and as GPT-2 style ``vocab.json`` + ``merges.txt`` (for the
torch engine and the export).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from hpcllm.atomic import atomic_paths
from hpcllm.progress import Progress
from hpcllm.text.tokenization import load_tokenizer, read_texts

log = logging.getLogger(__name__)


def sample_texts(shards: Sequence[Any], max_documents: int) -> Iterator[str]:
    """The first documents of each shard in turn, ``max_documents`` in all (deterministic).
    A shard is a JSONL file or an iterable of texts (a source's shard read in place,
    :class:`hpcllm.text.shards.ShardReader`)."""
    per_shard = max(1, max_documents // max(1, len(shards)))
    taken = 0
    for shard in shards:
        n = 0
        texts = shard if not isinstance(shard, (str, os.PathLike)) else None
        for batch in read_texts(shard, 1 << 20) if texts is None else [texts]:
            for text in batch:
                if n >= per_shard or taken >= max_documents:
                    break
                yield text
                n += 1
                taken += 1
            if n >= per_shard or taken >= max_documents:
                break


# Documents between progress updates (a power of 2: a mask tests it).
EVERY = 256


def _train_with_progress(tok: Any, trainer: Any, texts: list[str], vocab_size: int) -> None:
    """``train_from_iterator`` with progress: the trainer's first pass (it reads and
    counts the words of every document) as documents done of all, with rate and time
    left; its second (learning merges, inside the Rust trainer, which reports nothing to
    Python) as the time it has taken so far, every progress interval, so that a long one
    is seen to be alive."""
    counting = Progress("train_tokenizer: counting words", len(texts), "documents")
    counted = threading.Event()

    def fed() -> Iterator[str]:
        for i, text in enumerate(texts, 1):
            yield text
            if not i & (EVERY - 1):
                counting.update(i)
        counting.finish(len(texts))
        counted.set()

    done, trained = threading.Event(), threading.Event()

    def merging() -> None:
        counted.wait()
        start = time.monotonic()
        while not done.wait(max(counting.interval, 1.0)):
            elapsed = timedelta(seconds=round(time.monotonic() - start))
            log.info(
                "train_tokenizer: learning merges up to %s tokens, %s so far (the trainer "
                "reports no share)",
                f"{vocab_size:,}",
                elapsed,
            )
        if trained.is_set():
            elapsed = timedelta(seconds=round(time.monotonic() - start))
            log.info("train_tokenizer: merges learned in %s", elapsed)

    heartbeat = threading.Thread(target=merging, daemon=True)
    heartbeat.start()
    try:
        tok.train_from_iterator(fed(), trainer=trainer, length=len(texts))
        trained.set()
    finally:
        done.set()
        counted.set()
        heartbeat.join()


def hf_tokenizer_config(eod_token: str) -> dict:
    """What transformers' AutoTokenizer reads next to tokenizer.json: the fast tokenizer
    class, and the end-of-document token as its end-of-sequence token."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eod_token,
        "clean_up_tokenization_spaces": False,
    }


def train_bpe(
    shards: Sequence[Any],
    out_dir: str | os.PathLike,
    vocab_size: int,
    special_tokens: Sequence[str],
    sample_documents: int = 100_000,
    min_frequency: int = 2,
) -> Path:
    """Train and save; returns the path of ``tokenizer.json``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if not special_tokens:
        raise ValueError("train_bpe needs at least the end-of-document special token")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    reading = Progress("train_tokenizer: reading the sample", sample_documents, "documents")
    texts = []
    for text in sample_texts(shards, sample_documents):
        texts.append(text)
        if not len(texts) & (EVERY - 1):
            reading.update(len(texts))
    reading.finish(len(texts))
    if not texts:
        raise ValueError(f"no documents to train the tokenizer on in {', '.join(map(str, shards))}")
    log.info("training a %d-token byte-level BPE on %d documents", vocab_size, len(texts))
    _train_with_progress(tok, trainer, texts, vocab_size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = out / "tokenizer_config.json"
    with atomic_paths(out / "vocab.json", out / "merges.txt", config, out / "tokenizer.json") as (
        vocab,
        merges,
        tmp_config,
        tok_json,
    ):
        tmp_dir = out / ".model.incomplete"
        tmp_dir.mkdir(exist_ok=True)
        v, m = tok.model.save(str(tmp_dir))
        os.replace(v, vocab)
        os.replace(m, merges)
        tmp_dir.rmdir()
        tmp_config.write_text(json.dumps(hf_tokenizer_config(special_tokens[0]), indent=2) + "\n")
        tok.save(str(tok_json))
    got = load_tokenizer(out / "tokenizer.json", eod_token=special_tokens[0])
    log.info("saved %s (%d tokens)", out, got.get_vocab_size())
    return out / "tokenizer.json"
