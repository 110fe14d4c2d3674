"""Tokenize JSONL shards into Megatron's indexed dataset (``tokenize``).

Hugging Face ``tokenizers`` is the reference. Where ``gigatoken`` supports the tokenizer
it encodes instead (several times faster, identical ids); every run checks the first
batch against ``tokenizers`` and falls back to it on any difference. Documents stream
through in batches of bounded size: memory does not grow with the shard.
"""

from __future__ import annotations

import io
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from hpcllm.text.compressed import open_binary
from hpcllm.text.indexed_dataset import IndexedDatasetWriter, optimal_dtype

log = logging.getLogger(__name__)

ENCODERS = ("auto", "gigatoken", "hf")
PROBE_DOCS, PROBE_CHARS = 32, 4096


class TokenizerError(ValueError):
    """A tokenizer that cannot be loaded or does not match its configuration."""


def load_tokenizer(
    path: str | os.PathLike, vocab_size: int | None = None, eod_token: str | None = None
):
    """Load a ``tokenizer.json`` and check it against the configured vocabulary."""
    from tokenizers import Tokenizer

    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on bad JSON
        raise TokenizerError(f"{path}: not a loadable tokenizer.json ({e})") from None
    return check_tokenizer(tok, path, vocab_size, eod_token)


def check_tokenizer(tok, where: str | os.PathLike, vocab_size: int | None, eod_token: str | None):
    """Errors that name the file when a tokenizer does not match its configuration."""
    actual = tok.get_vocab_size(with_added_tokens=True)
    if vocab_size is not None and actual != vocab_size:
        raise TokenizerError(
            f"{where}: has a vocabulary of {actual} tokens but the config says vocab_size: "
            f"{vocab_size}; point the config at the right tokenizer or correct vocab_size"
        )
    if eod_token is not None and tok.token_to_id(eod_token) is None:
        raise TokenizerError(
            f"{where}: the end-of-document token '{eod_token}' is not in the vocabulary; "
            "set eod_token to one of its special tokens"
        )
    return tok


def tokenizer_from_gpt2_files(vocab: str | os.PathLike, merges: str | os.PathLike):
    """A ``tokenizers`` byte-level BPE from GPT-2 style ``vocab.json`` + ``merges.txt``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    for p in (vocab, merges):
        if not os.path.exists(p):
            raise TokenizerError(f"{p}: tokenizer file does not exist")
    tok = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


@dataclass
class Encoder:
    """Batch encoder returning ``(flat ids, lengths)``; ``name`` says which library."""

    name: str
    _encode: Any

    def encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        return self._encode(texts)


def hf_encoder(tok) -> Encoder:
    def encode(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        encs = tok.encode_batch_fast(list(texts), add_special_tokens=False)
        lengths = np.fromiter((len(e.ids) for e in encs), np.int64, len(encs))
        flat = np.fromiter((i for e in encs for i in e.ids), np.int64, int(lengths.sum()))
        return flat, lengths

    return Encoder("hf", encode)


def gigatoken_encoder(tok) -> Encoder:
    import awkward as ak
    import gigatoken

    gt = gigatoken.Tokenizer(tok)

    def encode(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        arr = gt.encode_batch(list(texts))
        return ak.to_numpy(ak.flatten(arr)), ak.to_numpy(ak.num(arr))

    return Encoder("gigatoken", encode)


def make_encoder(tok, choice: str = "auto", probe: Sequence[str] = ()) -> Encoder:
    """The fastest encoder that gives the reference ids on ``probe``.

    ``auto`` tries gigatoken, compares it with ``tokenizers`` on ``probe`` and falls back
    to ``tokenizers`` if it cannot load the tokenizer or differs on a single id.
    """
    if choice not in ENCODERS:
        raise TokenizerError(f"encoder '{choice}' unknown; use one of {', '.join(ENCODERS)}")
    reference = hf_encoder(tok)
    if choice == "hf":
        return reference
    try:
        fast = gigatoken_encoder(tok)
    except Exception as e:
        if choice == "gigatoken":
            raise TokenizerError(f"gigatoken cannot load this tokenizer: {e}") from e
        log.warning("gigatoken cannot load the tokenizer (%s); encoding with tokenizers", e)
        return reference
    if probe:
        got, want = fast.encode(probe), reference.encode(probe)
        if not (np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0])):
            if choice == "gigatoken":
                raise TokenizerError("gigatoken gives other ids than tokenizers for this tokenizer")
            log.warning(
                "gigatoken's ids differ from tokenizers' on the first batch; using tokenizers"
            )
            return reference
    return fast


def read_texts(path: str | os.PathLike, batch_bytes: int) -> Iterator[list[str]]:
    """Batches of texts from one of our JSONL shards, about ``batch_bytes`` each."""
    batch: list[str] = []
    size = 0
    with open_binary(path) as raw:
        for lineno, line in enumerate(io.BufferedReader(raw, 1 << 20), 1):
            try:
                text = orjson.loads(line)["text"]
            except (orjson.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(
                    f"{path}:{lineno}: not a shard written by download_text ({e}); "
                    "delete it and rerun download_text"
                ) from None
            batch.append(text)
            size += len(line)
            if size >= batch_bytes:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def _prefetch(it: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """Run ``it`` in a thread so reading and decompressing overlap with encoding."""
    q: queue.Queue = queue.Queue(depth)
    done = object()

    def work() -> None:
        try:
            for item in it:
                q.put(item)
        except BaseException as e:  # handed to the consumer, raised there
            q.put(e)
        q.put(done)

    threading.Thread(target=work, daemon=True).start()
    while (item := q.get()) is not done:
        if isinstance(item, BaseException):
            raise item
        yield item


def with_eod(flat: np.ndarray, lengths: np.ndarray, eod: int) -> tuple[np.ndarray, np.ndarray]:
    """Append ``eod`` after every document of a flat batch."""
    new_lengths = lengths + 1
    ends = np.cumsum(new_lengths) - 1
    out = np.empty(len(flat) + len(lengths), dtype=flat.dtype)
    mask = np.ones(len(out), dtype=bool)
    mask[ends] = False
    out[mask] = flat
    out[ends] = eod
    return out, new_lengths


@dataclass(frozen=True)
class TokenizeStats:
    documents: int
    tokens: int
    seconds: float
    encoder: str


def tokenize_shard(
    jsonl_path: str | os.PathLike,
    output_prefix: str | os.PathLike,
    tok,
    eod_token: str | None,
    append_eod: bool = True,
    encoder: str = "auto",
    batch_bytes: int = 4 << 20,
) -> TokenizeStats:
    """Tokenize one JSONL shard into ``{output_prefix}.bin/.idx``."""
    start = time.monotonic()
    eod = tok.token_to_id(eod_token) if eod_token else None
    if append_eod and eod is None:
        raise TokenizerError(
            f"append_eod needs an eod_token that is in the vocabulary, got {eod_token!r}"
        )
    dtype = optimal_dtype(tok.get_vocab_size(with_added_tokens=True))
    batches = _prefetch(read_texts(jsonl_path, batch_bytes))
    first = next(batches, [])
    # A small probe (some 100 KB) keeps the reference encoder's cost out of the stage.
    enc = make_encoder(tok, encoder, probe=[text[:PROBE_CHARS] for text in first[:PROBE_DOCS]])
    log.info("%s: encoding with %s into %s (%s)", jsonl_path, enc.name, output_prefix, dtype)
    docs = tokens = 0
    last_report = start
    with IndexedDatasetWriter(output_prefix, dtype) as writer:
        for batch in _chain([first] if first else [], batches):
            flat, lengths = enc.encode(batch)
            if append_eod:
                flat, lengths = with_eod(flat, lengths, eod)
            writer.add_documents(flat, lengths)
            docs += len(lengths)
            tokens += len(flat)
            now = time.monotonic()
            if now - last_report > 10:
                last_report = now
                log.info(
                    "%d documents, %d tokens, %.2f M tokens/s",
                    docs,
                    tokens,
                    tokens / (now - start) / 1e6,
                )
    elapsed = time.monotonic() - start
    log.info(
        "%s: %d documents, %d tokens in %.2f s (%.2f M tokens/s, %s)",
        output_prefix,
        docs,
        tokens,
        elapsed,
        tokens / max(elapsed, 1e-9) / 1e6,
        enc.name,
    )
    return TokenizeStats(docs, tokens, elapsed, enc.name)


def _chain(head: list, tail: Iterator) -> Iterator:
    yield from head
    yield from tail
