"""Training samples exactly as Megatron-LM draws them, built on the CPU.

Megatron Core's ``GPTDataset`` and ``BlendedMegatronDatasetBuilder`` build the document,
sample and shuffle indices (sequence length + 1 tokens per sample across document
boundaries, a seeded shuffle, the ``949,50,1``-style split, blend weights) with NumPy and
their C++ helper; no GPU is needed. Using them instead of a re-implementation gives the
torch engine the very samples Megatron would train on.

Megatron Core hangs (``GPTDataset._get_num_epochs`` loops forever) when samples are asked
from a split that received no documents, so ``check_splits`` refuses that case first.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcllm.text.indexed_dataset import IndexedDatasetError, check_dataset, data_paths

log = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "valid", "test")
# Token ids are checked against the vocabulary on at most this many bytes per dataset
# (the start of the file): enough to catch a wrong tokenizer, cheap on terabytes.
TOKEN_CHECK_BYTES = 256 << 20


class DataError(ValueError):
    """Training data that is missing or does not fit the experiment; says what to fix."""


@dataclass(frozen=True)
class Blend:
    prefixes: tuple[str, ...]  # dataset path prefixes without .bin/.idx
    weights: tuple[float, ...] | None  # None: by dataset size, as Megatron does

    def megatron_data_path(self) -> list[str]:
        """The ``--data-path`` values: ``weight prefix ...`` or the prefixes alone."""
        if self.weights is None:
            return list(self.prefixes)
        return [x for w, p in zip(self.weights, self.prefixes) for x in (f"{w:g}", p)]


def data_digest(prefixes: Sequence[str]) -> str:
    """What the blend's datasets hold, for the records of what a model was trained on:
    each ``.idx`` (every document's length and place) and each ``.bin``'s size. Reading
    the ``.bin`` files (terabytes) is left out; tokenization that changes a token changes
    the documents' lengths too, except in the rarest cases."""
    import hashlib

    h = hashlib.sha256()
    for prefix in prefixes:
        idx, bin_ = f"{prefix}.idx", f"{prefix}.bin"
        h.update(f"{Path(prefix).name}\0{os.path.getsize(bin_)}\0".encode())
        with open(idx, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def parse_split(split: str) -> list[float]:
    """Megatron's split string (``"949,50,1"``) as normalised fractions, three of them."""
    try:
        parts = [float(x) for x in re.findall(r"[^,\s]+", split)]
    except ValueError:
        raise DataError(f"split {split!r}: not a comma-separated list of numbers") from None
    if not 1 <= len(parts) <= 3 or any(p < 0 for p in parts) or sum(parts) <= 0:
        raise DataError(
            f"split {split!r}: give up to three non-negative weights for train, valid, "
            "test, e.g. '949,50,1'"
        )
    parts += [0.0] * (3 - len(parts))
    total = sum(parts)
    return [p / total for p in parts]


def split_document_counts(num_documents: int, split: str) -> list[int]:
    """Documents each split receives, with the rounding of Megatron's dataset builder."""
    fractions = parse_split(split)
    bounds = np.cumsum([0.0, *fractions])
    return [
        int(round(bounds[i + 1] * num_documents)) - int(round(bounds[i] * num_documents))
        for i in range(3)
    ]


def check_splits(blend: Blend, split: str, samples: Sequence[int]) -> None:
    """Refuse a split that Megatron would build without documents (it would hang).

    A split with a non-zero share is built even when no samples are asked of it (Megatron
    then still wants one token), so every such split needs documents in every dataset.
    """
    fractions = parse_split(split)
    for name, fraction, wanted in zip(SPLIT_NAMES, fractions, samples):
        if wanted > 0 and fraction == 0:
            raise DataError(
                f"split '{split}' gives the {name} split no share, but {wanted} {name} "
                f"samples are needed; give {name} a share or ask for none"
            )
    for prefix in blend.prefixes:
        n_docs = len(check_dataset(prefix).sequence_lengths)
        counts = split_document_counts(n_docs, split)
        for name, fraction, count in zip(SPLIT_NAMES, fractions, counts):
            if fraction > 0 and count == 0:
                raise DataError(
                    f"{prefix}: has {n_docs} documents, and split '{split}' gives the {name} "
                    f"split none of them (Megatron would hang building it). Give {name} a "
                    f"larger share, a share of 0 if it is not used (e.g. '98,2,0'), or use "
                    "more data."
                )


def check_blend(blend: Blend, vocab_size: int) -> None:
    """Every dataset exists, is intact, and holds only token ids below ``vocab_size``."""
    for prefix in blend.prefixes:
        try:
            index = check_dataset(prefix)
        except IndexedDatasetError as e:
            raise DataError(
                f"training data {prefix}(.bin/.idx): {e}. Check the experiment's data "
                "sources and tokenizer, or rerun the text stage that makes it."
            ) from None
        bin_path = data_paths(prefix)[0]
        count = min(index.num_tokens, TOKEN_CHECK_BYTES // index.dtype.itemsize)
        if count:
            tokens = np.memmap(bin_path, dtype=index.dtype, mode="r", shape=(count,))
            top = int(tokens.max())
            if top >= vocab_size:
                raise DataError(
                    f"{bin_path}: holds token id {top}, but the tokenizer has only "
                    f"{vocab_size} tokens: the data was made with another tokenizer. Use "
                    "the tokenizer it was tokenized with, or tokenize it again."
                )


class _Tokenizer:
    """What ``GPTDataset`` asks of a tokenizer: its size and end-of-document id."""

    def __init__(self, vocab_size: int, eod: int):
        self.vocab_size = vocab_size
        self.eod = eod
        self.special_tokens_dict = {}
        # Part of the dataset's cache key: another vocabulary gives other index files.
        self.unique_identifiers = {"class": "hpcllm", "vocab_size": vocab_size, "eod": eod}

    # No pad token: Megatron then uses an id that never occurs in the data.


def build_datasets(
    blend: Blend | None,
    split: str,
    seq_length: int,
    seed: int,
    samples: Sequence[int],
    vocab_size: int,
    eod: int,
    cache_dir: str | os.PathLike | None,
    tokenizer=None,
) -> list:
    """Train, valid and test datasets of Megatron Core (None for a split not asked for).

    ``blend`` None gives Megatron's mock data (for benchmarks). Index files are cached in
    ``cache_dir`` (Megatron's ``--data-cache-path``): the ``prepare_data_cache`` rule
    builds them on a CPU job, and every segment loads them. ``tokenizer`` is part of the
    cache key (default: the torch engine's); a split with no share is never built, so its
    sample count is ignored, as Megatron does.
    """
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset

    sizes = [int(s) for s in samples]
    if blend is not None:
        sizes = [n if share > 0 else 0 for n, share in zip(sizes, parse_split(split))]
        check_splits(blend, split, sizes)
    if cache_dir is not None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
    config = GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_length,
        blend=(list(blend.prefixes), list(blend.weights) if blend.weights else None)
        if blend
        else None,
        split=split if blend else None,
        path_to_cache=str(cache_dir) if cache_dir is not None else None,
        tokenizer=tokenizer or _Tokenizer(vocab_size, eod),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        # pretrain_gpt.py passes --dataloader-inter-document-masking (never generated):
        # no per-document boundaries (cu_seqlens) in a sample; not part of the cache key
        inter_document_masking=False,
    )
    cls = GPTDataset if blend else MockGPTDataset
    datasets = BlendedMegatronDatasetBuilder(cls, sizes, lambda: True, config).build()
    return [d if s else None for d, s in zip(datasets, sizes)]


def sample_counts(train_iters: int, global_batch: int, eval_interval: int, eval_iters: int):
    """Samples per split, as Megatron-LM's ``get_train_valid_test_num_samples`` asks.

    They are part of the index cache's key: the cache rule and both engines use this.
    """
    evaluations = train_iters // eval_interval + 1
    return [
        train_iters * global_batch,
        evaluations * eval_iters * global_batch,
        eval_iters * global_batch,
    ]
