"""Tokenize JSONL shards into Megatron's indexed dataset (``tokenize``).

Hugging Face ``tokenizers`` is the reference. Where ``gigatoken`` supports the tokenizer
it encodes instead (several times faster, identical ids); every shard checks it against
``tokenizers`` on texts holding every special token and on documents picked at random
over the shard, a bounded share of its text (see :class:`SampledCheck`). Documents stream through
in batches of bounded size, and a huge document is encoded in pieces cut at whitespace
where that gives the same ids: memory does not grow with the shard or the document.

Special tokens written inside a document (``<|endoftext|>`` in web text) are encoded as
ordinary text by default, so the end-of-document id appears only where the workflow
appends it; ``special_tokens_in_text: special`` keeps HF's and Megatron-LM's behaviour.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from hpcllm.progress import Progress
from hpcllm.text.arrow_texts import utf8_data, utf8_offsets
from hpcllm.text.compressed import open_binary
from hpcllm.text.indexed_dataset import IndexedDatasetWriter, optimal_dtype

log = logging.getLogger(__name__)

ENCODERS = ("auto", "gigatoken", "hf")
SPECIAL_HANDLING = ("text", "special")
# Documents longer than this are encoded in pieces (where the tokenizer allows it).
PIECE_CHARS = 1 << 20
# What every shard checks against the reference (HF tokenizers), on top of the fixed
# probe texts: documents picked at random in every batch, worth CHECK_FRACTION of the
# batch's characters plus half of what is left of CHECK_RESERVE_CHARS (a small shard is so
# checked almost whole, a FineWeb-sized one at about CHECK_FRACTION). The reference
# encodes a character about 80-100x slower than the whole stage (measured here on a
# 0.5 GB FineWeb-shaped shard, docs/measurements/text.md): 1/8000 keeps the check's calls under 10 %
# of the stage's time (1/1000 took 9-14 %, 1/4000 10-12 % once encoding ran beside it).
CHECK_FRACTION = 1.25e-4
CHECK_RESERVE_CHARS = 64 << 10
CHECK_CHARS = 4096  # the window checked when no whole document fits the allowance
_CUT = re.compile(r"\s(?=\S)")  # the last whitespace of a run, before a non-space


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


def special_tokens_of(tok) -> list[str]:
    """The special tokens of ``tok`` (its added tokens marked special)."""
    return [t.content for t in tok.get_added_tokens_decoder().values() if t.special]


def with_special_handling(tok, special_tokens_in_text: str):
    """A copy of ``tok`` that reads special tokens written inside text as configured:
    ``text`` encodes them like any other text, ``special`` gives their ids (HF's default)."""
    from tokenizers import Tokenizer

    if special_tokens_in_text not in SPECIAL_HANDLING:
        raise TokenizerError(
            f"special_tokens_in_text '{special_tokens_in_text}' unknown; use one of "
            f"{', '.join(SPECIAL_HANDLING)}"
        )
    copy = Tokenizer.from_str(tok.to_str())
    copy.encode_special_tokens = special_tokens_in_text == "text"
    return copy


def probe_texts(tok) -> list[str]:
    """Texts on which an accelerated encoder must match the reference before it is used:
    every special token alone, inside words and next to each other, and the usual hard
    cases of byte-level BPE (scripts, emoji, whitespace runs, control characters)."""
    specials = special_tokens_of(tok)
    texts = [
        "Hello, world! Größe, Straße; été, où? Ελληνικά, Русский, 日本語の文章, 中文, 한국어, العربية",
        "Emoji 🚀🇪🇺 👨‍👩‍👧‍👦 👍🏽, combining e\u0301, NBSP\u00a0, zero width\u200b, \u2028",
        "tabs\tand\nnewlines\r\n  \n\n   spaces   and \x01\x7f control",
        "x" * 5000 + " " * 300 + "word " * 300,
        "".join(specials),
    ]
    for special in specials:
        texts += [special, f"a{special}b", f" {special} ", f"text\n{special}\nmore {special}."]
    return texts


# A batch of texts: a list of ``str``, or an Arrow string array (Parquet rows handed over
# without a Python string per document; see hpcllm.text.shards.shard_batches).
Texts = Any


def is_arrow(texts: Texts) -> bool:
    return type(texts).__module__.startswith("pyarrow")


def text_sizes(texts: Texts) -> np.ndarray:
    """Every text's size: its characters for ``str`` (``len``), its UTF-8 bytes for Arrow
    (from the offsets, without reading the text; never fewer than its characters)."""
    if is_arrow(texts):
        return np.diff(utf8_offsets(texts))
    return np.fromiter(map(len, texts), np.int64, len(texts))


def text_at(texts: Texts, i: int) -> str:
    return texts[i].as_py() if is_arrow(texts) else texts[i]


def as_list(texts: Texts) -> list[str]:
    return texts.to_pylist() if is_arrow(texts) else list(texts)


def awkward_strings(texts: Any):
    """An Arrow string array as the awkward array of strings gigatoken reads: the Arrow
    data buffer itself (no copy) with 64-bit offsets (gigatoken takes no others)."""
    import awkward as ak

    return ak.Array(
        ak.contents.ListOffsetArray(
            ak.index.Index64(utf8_offsets(texts)),
            ak.contents.NumpyArray(utf8_data(texts), parameters={"__array__": "char"}),
            parameters={"__array__": "string"},
        )
    )


@dataclass
class Encoder:
    """Batch encoder returning ``(flat ids, lengths)``; ``name`` says which library."""

    name: str
    _encode: Any

    def encode(self, texts: Texts) -> tuple[np.ndarray, np.ndarray]:
        return self._encode(texts)


def hf_encoder(tok) -> Encoder:
    def encode(texts: Texts) -> tuple[np.ndarray, np.ndarray]:
        encs = tok.encode_batch_fast(as_list(texts), add_special_tokens=False)
        lengths = np.fromiter((len(e.ids) for e in encs), np.int64, len(encs))
        flat = np.fromiter((i for e in encs for i in e.ids), np.int64, int(lengths.sum()))
        return flat, lengths

    return Encoder("hf", encode)


# Below this many characters a batch of Python strings is encoded document by document
# on the calling thread, also where the encoder has a pool: the pool's gain on it is
# smaller than importing awkward (with pyarrow and fsspec, about 0.17 CPU-s), which
# gigatoken's encode_batch builds its result with. A one-document job never imports it.
EACH_DOCUMENT_CHARS = 1 << 20


def encode_each(gt, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``texts`` encoded one by one with gigatoken's ``encode`` (a numpy array each: the
    ids ``encode_batch`` gives, without awkward), as ``(flat ids, lengths)``."""
    ids = [gt.encode(t) for t in texts]
    lengths = np.fromiter((len(i) for i in ids), np.int64, len(ids))
    return (np.concatenate(ids) if ids else np.zeros(0, np.uint32)), lengths


class _Gigatoken:
    """gigatoken's two ways to a batch's ids, kept apart between threads: ``encode``
    borrows the tokenizer exclusively (it holds the GIL), ``encode_batch`` shares it and
    releases the GIL, and gigatoken raises "Already borrowed" when the first runs while
    the second does (a check's window on this thread while the next batch is encoded on
    the stage's encoding thread)."""

    def __init__(self, gt, threads: int) -> None:
        self.gt, self.threads = gt, threads
        self.lock = threading.Lock()
        self.batches = 0  # encode_batch calls running

    def encode(self, texts: Texts) -> tuple[np.ndarray, np.ndarray]:
        if not is_arrow(texts) and (
            self.threads == 1 or sum(len(t) for t in texts) < EACH_DOCUMENT_CHARS
        ):
            with self.lock:
                if not self.batches:
                    return encode_each(self.gt, texts)
        import awkward as ak

        with self.lock:
            self.batches += 1
        try:
            arr = self.gt.encode_batch(awkward_strings(texts) if is_arrow(texts) else list(texts))
        finally:
            with self.lock:
                self.batches -= 1
        return ak.to_numpy(ak.flatten(arr)), ak.to_numpy(ak.num(arr))


def gigatoken_encoder(tok, threads: int | None = None) -> Encoder:
    """gigatoken for ``tok``. ``threads``: its pool's threads (default: what
    ``RAYON_NUM_THREADS`` says, as gigatoken reads it); with one, batches of strings are
    encoded document by document (as fast as ``encode_batch`` on one thread: 0.17 CPU-s
    for 48 MB against 0.16-0.27, and without awkward's import)."""
    import gigatoken

    data = tok.to_str()
    if tok.encode_special_tokens:
        # gigatoken always maps special tokens in text to their ids: give it the tokenizer
        # without its added tokens, which then reads them as text (as the probe checks).
        config = orjson.loads(data)
        config["added_tokens"] = []
        data = orjson.dumps(config)
    # From the JSON, not through a tokenizers object: a second copy of the tokenizer in
    # tokenizers costs 0.1-0.2 s of every job's start-up for a 32k vocabulary.
    gt = gigatoken.Tokenizer.from_json(data)
    if threads is None:
        threads = int(os.environ.get("RAYON_NUM_THREADS") or 0)  # unset: every core
    return Encoder("gigatoken", _Gigatoken(gt, threads).encode)


def same_ids(a: Encoder, b: Encoder, texts: Sequence[str]) -> bool:
    got, want = a.encode(texts), b.encode(texts)
    return np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0])


def load_fast_encoder(tok, choice: str = "auto") -> Encoder | Exception | None:
    """gigatoken loaded for ``tok`` (the exception if it cannot be; ``None`` for ``hf``):
    the first half of :func:`make_encoder`, to run while the first batch is read."""
    if choice not in ENCODERS:
        raise TokenizerError(f"encoder '{choice}' unknown; use one of {', '.join(ENCODERS)}")
    if choice == "hf":
        return None
    try:
        return gigatoken_encoder(tok)
    except Exception as e:
        return e


def make_encoder(
    tok,
    choice: str = "auto",
    probe: Sequence[str] = (),
    loaded: Encoder | Exception | None = None,
) -> Encoder:
    """The fastest encoder that gives the reference ids on ``probe`` and :func:`probe_texts`.

    ``auto`` tries gigatoken, compares it with ``tokenizers`` and falls back to
    ``tokenizers`` if it cannot load the tokenizer or differs on a single id.
    ``loaded``: what :func:`load_fast_encoder` gave, if it ran already.
    """
    if choice not in ENCODERS:
        raise TokenizerError(f"encoder '{choice}' unknown; use one of {', '.join(ENCODERS)}")
    reference = hf_encoder(tok)
    if choice == "hf":
        return reference
    fast = loaded if loaded is not None else load_fast_encoder(tok, choice)
    if isinstance(fast, Exception):
        e = fast
        if choice == "gigatoken":
            raise TokenizerError(f"gigatoken cannot load this tokenizer: {e}") from e
        log.warning("gigatoken cannot load the tokenizer (%s); encoding with tokenizers", e)
        return reference
    if not same_ids(fast, reference, [*probe_texts(tok), *probe]):
        if choice == "gigatoken":
            raise TokenizerError("gigatoken gives other ids than tokenizers for this tokenizer")
        log.warning("gigatoken's ids differ from tokenizers' on the probe; using tokenizers")
        return reference
    return fast


def splits_at_whitespace(tok) -> bool:
    """Whether cutting a text before the last whitespace of a run leaves its ids unchanged:
    true of the GPT-2 byte-level pre-tokenizer (every pre-token that starts with
    whitespace starts with exactly one such character, and none ends with a non-space
    followed by whitespace), not of others (Llama 3's regex keeps a space before newlines
    together with them)."""
    from tokenizers import pre_tokenizers

    # From the tokenizer's objects: its JSON (to_str) costs 0.1-0.4 s for a 32k vocabulary.
    pre = tok.pre_tokenizer
    return (
        isinstance(pre, pre_tokenizers.ByteLevel)
        and pre.use_regex
        and not pre.add_prefix_space
        and tok.normalizer is None
    )


def pieces(text: str, max_chars: int) -> list[str]:
    """``text`` cut before the last whitespace of a run, into pieces of at most
    ``max_chars`` where possible (a longer run without whitespace stays whole)."""
    out, start = [], 0
    while len(text) - start > max_chars:
        cut = None
        for m in _CUT.finditer(text, start + 1, start + max_chars + 1):
            cut = m.start()
        if cut is None:  # no whitespace in the window: up to the next one
            m = _CUT.search(text, start + max_chars + 1)
            if m is None:
                break
            cut = m.start()
        out.append(text[start:cut])
        start = cut
    out.append(text[start:])
    return out


def in_pieces(enc: Encoder, max_chars: int, budget_chars: int) -> Encoder:
    """``enc`` with documents over ``max_chars`` encoded piece by piece, at most
    ``budget_chars`` of pieces at a time: a 60 MB document costs the memory of a batch."""

    def encode(texts: Texts) -> tuple[np.ndarray, np.ndarray]:
        if not len(texts) or text_sizes(texts).max() <= max_chars:
            return enc.encode(texts)
        texts = as_list(texts)
        flats, lengths = [], []
        group: list[str] = []
        size = 0

        def flush() -> None:
            nonlocal group, size
            if group:
                flat, lens = enc.encode(group)
                flats.append(flat)
                lengths.append(lens)
            group, size = [], 0

        owners = []
        for i, text in enumerate(texts):
            for piece in pieces(text, max_chars) if len(text) > max_chars else [text]:
                if size + len(piece) > budget_chars:
                    flush()
                group.append(piece)
                owners.append(i)
                size += len(piece)
        flush()
        piece_lengths = np.concatenate(lengths)
        doc_lengths = np.bincount(owners, weights=piece_lengths, minlength=len(texts))
        return np.concatenate(flats), doc_lengths.astype(np.int64)

    return Encoder(enc.name, encode)


class SampledCheck:
    """Documents of each batch, picked at random, whose ids are compared with the
    reference's: together at most ``fraction`` of the characters seen plus ``reserve``
    (half of what is left of it per batch). Unspent allowance carries over to the next
    batch; a batch whose documents are all longer than the allowance gets a window of
    ``CHECK_CHARS`` of one of them instead, once the allowance reaches that."""

    def __init__(
        self,
        fraction: float = CHECK_FRACTION,
        reserve: int = CHECK_RESERVE_CHARS,
        max_doc_chars: int = PIECE_CHARS,
        seed: int = 0,
    ):
        if not 0 <= fraction <= 1:
            raise ValueError(f"check fraction {fraction} is not between 0 and 1")
        self.fraction, self.reserve, self.max_doc_chars = fraction, reserve, max_doc_chars
        self.credit = 0.0
        self.checked_chars = self.seen_chars = self.checked_docs = 0
        self.rng = np.random.default_rng(seed)

    def pick(self, texts: Texts) -> tuple[list[int], str | None]:
        """Indices of whole documents of ``texts`` to check, and a window to check when
        none fits (or ``None``)."""
        sizes = text_sizes(texts)
        chars = int(sizes.sum())
        self.seen_chars += chars
        share = self.reserve / 2
        self.reserve -= share
        self.credit += self.fraction * chars + share
        picked: list[int] = []
        limit = min(self.credit, self.max_doc_chars)
        for i in self.rng.permutation(len(texts)) if len(texts) else ():
            n = int(sizes[i])
            if n <= limit:
                picked.append(int(i))
                limit -= n
                self.credit -= n
                self.checked_chars += n
            if limit < 1:
                break
        window = None
        if not picked and len(texts) and self.credit >= CHECK_CHARS:
            i = int(self.rng.integers(len(texts)))
            text = text_at(texts, i)
            start = int(self.rng.integers(max(len(text) - CHECK_CHARS, 0) + 1))
            window = text[start : start + CHECK_CHARS]
            self.credit -= len(window)
            self.checked_chars += len(window)
        self.checked_docs += len(picked)
        return sorted(picked), window


def differing_document(
    reference: Encoder, texts: Sequence[str], flat: np.ndarray, lengths: np.ndarray, picked
) -> int | None:
    """The first of the ``picked`` documents whose ids in ``flat``/``lengths`` (as
    written) are not the reference's, or ``None``."""
    if not picked:
        return None
    ref_flat, ref_lengths = reference.encode([text_at(texts, i) for i in picked])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ref_offsets = np.concatenate([[0], np.cumsum(ref_lengths)])
    for k, i in enumerate(picked):
        got = flat[offsets[i] : offsets[i + 1]]
        want = ref_flat[ref_offsets[k] : ref_offsets[k + 1]]
        if not np.array_equal(got, want):
            return i
    return None


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
                    f'{path}:{lineno}: not a JSONL shard of {{"text": ...}} lines ({e}); '
                    "write it again"
                ) from None
            batch.append(text)
            size += len(line)
            if size >= batch_bytes:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def _prefetch(it: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """Run ``it`` in a thread, started at once, so reading and decompressing overlap with
    loading the encoder and encoding."""
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

    def items() -> Iterator[Any]:
        while (item := q.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item

    return items()


def with_eod(
    flat: np.ndarray, lengths: np.ndarray, eod: int, dtype: np.dtype | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Append ``eod`` after every document of a flat batch, as ``dtype`` (the dataset's:
    converted in the same pass, not in a copy of its own)."""
    new_lengths = lengths + 1
    ends = np.cumsum(new_lengths) - 1
    if (
        dtype is not None
        and len(flat)
        and ((flat.dtype.kind != "u" and flat.min() < 0) or flat.max() > np.iinfo(dtype).max)
    ):
        raise ValueError(f"token ids do not fit the dataset dtype {np.dtype(dtype)}")
    out = np.empty(len(flat) + len(lengths), dtype=flat.dtype if dtype is None else dtype)
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
    special_tokens_in_text: str = "text",
    piece_chars: int = PIECE_CHARS,
    total_documents: int | Callable[[], int | None] | None = None,
    check_fraction: float = CHECK_FRACTION,
    label: str | None = None,
) -> TokenizeStats:
    """Tokenize one JSONL shard, or batches of texts (lists of str, with ``label`` naming
    them in messages), into ``{output_prefix}.bin/.idx``; ``total_documents`` (from the
    shard's manifest, or a function asked at every batch for what is known by then) gives
    the progress lines their share and ETA;
    ``check_fraction`` is the share of the text checked against the reference (see
    :class:`SampledCheck`)."""
    start = time.monotonic()
    eod = tok.token_to_id(eod_token) if eod_token else None
    if append_eod and eod is None:
        raise TokenizerError(
            f"append_eod needs an eod_token that is in the vocabulary, got {eod_token!r}"
        )
    with special_handling(tok, special_tokens_in_text):
        if isinstance(jsonl_path, (str, os.PathLike)):
            label, batches = str(jsonl_path), read_texts(jsonl_path, batch_bytes)
        else:
            label, batches = label or "texts", iter(jsonl_path)
        return _tokenize_shard(
            batches,
            label,
            output_prefix,
            tok,
            eod,
            append_eod,
            encoder,
            batch_bytes,
            piece_chars,
            total_documents,
            check_fraction,
            start,
        )


@contextlib.contextmanager
def special_handling(tok, special_tokens_in_text: str) -> Iterator[None]:
    """``tok`` reading special tokens in text as configured, restored afterwards: what
    :func:`with_special_handling` gives, without the copy of the tokenizer (0.1-0.2 s of
    every job for a 32k vocabulary)."""
    if special_tokens_in_text not in SPECIAL_HANDLING:
        raise TokenizerError(
            f"special_tokens_in_text '{special_tokens_in_text}' unknown; use one of "
            f"{', '.join(SPECIAL_HANDLING)}"
        )
    saved = tok.encode_special_tokens
    tok.encode_special_tokens = special_tokens_in_text == "text"
    try:
        yield
    finally:
        tok.encode_special_tokens = saved


def _tokenize_shard(
    texts,
    jsonl_path,
    output_prefix,
    tok,
    eod,
    append_eod,
    encoder,
    batch_bytes,
    piece_chars,
    total_documents,
    check_fraction,
    start,
) -> TokenizeStats:
    dtype = optimal_dtype(tok.get_vocab_size(with_added_tokens=True))
    # Up to 16 batches read ahead (64 MiB at the default batch_bytes): pyarrow decodes a
    # Parquet batch of 4096 rows (~50 MB of web text) in one burst, which a queue of 2
    # made the encoder wait for; the stage on a 0.5 GB shard took 4.9 s with 2, 4.0 s
    # with 16 or 64 (medians of 4, 2 cores; benchmarks/tokenize_stage.py).
    batches = _prefetch(texts, depth=16)
    # gigatoken loads (its imports and BPE hold the GIL) while the thread reads the first
    # batch (pyarrow's decoding releases it).
    loaded = load_fast_encoder(tok, encoder)
    first = next(batches, [])
    check = SampledCheck(check_fraction, max_doc_chars=piece_chars)
    # The first batch's sample is the probe: a difference there falls back to tokenizers.
    picked, window = check.pick(first)
    probe = [text_at(first, i) for i in picked] + ([window] if window else [])
    enc = make_encoder(tok, encoder, probe=probe, loaded=loaded)
    reference = hf_encoder(tok)
    if not splits_at_whitespace(tok):
        piece_chars = 1 << 62  # pieces would change the ids: whole documents
    encode = in_pieces(enc, piece_chars, batch_bytes)
    log.info("%s: encoding with %s into %s (%s)", jsonl_path, enc.name, output_prefix, dtype)
    docs = tokens = 0
    total = total_documents if callable(total_documents) else lambda: total_documents
    progress = Progress(f"tokenize {Path(output_prefix).name}", total(), "documents")
    # Encoding in a thread of its own (gigatoken releases the GIL): this one checks and
    # writes batch n while n + 1 is encoded. The stage on a 0.5 GB shard: 4.1 s against
    # 4.4 s with encoding and writing in turn (medians of 5, faster in every round).
    batches = _chain([first] if len(first) else [], batches)
    encoded = _prefetch(((batch, encode.encode(batch)) for batch in batches), depth=2)
    with IndexedDatasetWriter(output_prefix, dtype) as writer:
        for n, (batch, (flat, lengths)) in enumerate(encoded):
            if n and enc.name != reference.name:
                # Every later batch: the ids written for documents picked at random are
                # compared with the reference's, so a difference the probe missed stops
                # the job instead of entering the data.
                picked, window = check.pick(batch)
                bad = differing_document(reference, batch, flat, lengths, picked)
                if bad is None and window is not None and not same_ids(enc, reference, [window]):
                    bad = 0
                if bad is not None:
                    raise TokenizerError(
                        f"{jsonl_path}: {enc.name} gave other ids than tokenizers for the "
                        f"document after {docs + bad} documents; set text.tokenize.encoder: hf"
                    )
            if append_eod:
                flat, lengths = with_eod(flat, lengths, eod, dtype)
            writer.add_documents(flat, lengths)
            docs += len(lengths)
            tokens += len(flat)
            progress.total = total()
            progress.update(docs)
    progress.total = total()
    progress.finish(docs)
    elapsed = time.monotonic() - start
    log.info(
        "%s: %d documents, %d tokens in %.2f s (%.2f M tokens/s, %s); checked against "
        "tokenizers: %d documents, %d characters (%.3f %% of the text)",
        output_prefix,
        docs,
        tokens,
        elapsed,
        tokens / max(elapsed, 1e-9) / 1e6,
        enc.name,
        check.checked_docs,
        check.checked_chars,
        100 * check.checked_chars / max(check.seen_chars, 1),
    )
    return TokenizeStats(docs, tokens, elapsed, enc.name)


def _chain(head: list, tail: Iterator) -> Iterator:
    yield from head
    yield from tail
