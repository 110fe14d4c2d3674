"""Held-out perplexity of the exported model on the experiment's own validation split.

The validation split is the one the engines train beside: Megatron's GPTDataset splits
each dataset by sequence (document) index, the ``train,valid,test`` fractions rounded as
in ``hpcllm.training.plan.data.split_document_counts``. Its documents are read in order,
concatenated across document boundaries (as Megatron's samples are) and cut into windows
of ``seq_length + 1`` tokens: the model reads ``seq_length`` tokens and is scored on each
next one. Per source (dataset) and over all: exp(mean negative log-likelihood per token).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import numpy as np

from hpcllm.evaluation.model import EvaluationError
from hpcllm.text.indexed_dataset import check_dataset, data_paths
from hpcllm.training.plan.data import split_document_counts


def validation_tokens(prefix: str, split: str, max_tokens: int | None) -> np.ndarray:
    """The tokens of ``prefix``'s validation documents in order, at most ``max_tokens``."""
    index = check_dataset(prefix)
    counts = split_document_counts(len(index.sequence_lengths), split)
    first, n = counts[0], counts[1]
    if n == 0:
        raise EvaluationError(
            f"{prefix}: split '{split}' gives the validation split none of its "
            f"{len(index.sequence_lengths)} documents; give valid a share in the "
            "experiment's data.split to measure held-out perplexity"
        )
    start = int(index.sequence_pointers[first])
    length = int(index.sequence_lengths[first : first + n].sum())
    if max_tokens is not None:
        length = min(length, max_tokens)
    data = np.memmap(data_paths(prefix)[0], dtype=index.dtype, mode="r",
                     offset=start, shape=(length,))  # fmt: skip
    return np.asarray(data, dtype=np.int64)


def windows(tokens: np.ndarray, seq_length: int) -> Iterator[np.ndarray]:
    """Windows of ``seq_length + 1`` tokens overlapping by one (each token but the first
    is predicted once); the last may be shorter."""
    for start in range(0, max(len(tokens) - 1, 0), seq_length):
        yield tokens[start : start + seq_length + 1]


def perplexity(
    model_dir: str | os.PathLike,
    prefixes: dict[str, str],
    split: str,
    seq_length: int,
    max_tokens: int | None,
    device: str,
    batch_size: int = 8,
) -> dict:
    """Per source (name -> dataset prefix) and over all: tokens scored, mean NLL, perplexity."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).to(device).eval()
    vocab = model.get_input_embeddings().num_embeddings
    sources = {}
    total_nll, total_tokens = 0.0, 0
    for name, prefix in prefixes.items():
        tokens = validation_tokens(prefix, split, max_tokens)
        if len(tokens) and int(tokens.max()) >= vocab:
            raise EvaluationError(
                f"{prefix}: holds token id {int(tokens.max())}, but the exported model has "
                f"{vocab} embeddings: it was not trained on this data's tokenizer"
            )
        nll, scored = 0.0, 0
        batch: list[np.ndarray] = []
        chunks = list(windows(tokens, seq_length))
        for i, chunk in enumerate(chunks):
            batch.append(chunk)
            if len(batch) == batch_size or i == len(chunks) - 1:
                n, s = _batch_nll(model, batch, device, torch)
                nll, scored = nll + n, scored + s
                batch = []
        sources[name] = _summary(nll, scored)
        total_nll, total_tokens = total_nll + nll, total_tokens + scored
    return {"sources": sources, "all": _summary(total_nll, total_tokens),
            "seq_length": seq_length, "split": split}  # fmt: skip


def _batch_nll(model, batch: list[np.ndarray], device: str, torch) -> tuple[float, int]:
    width = max(len(c) for c in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, chunk in enumerate(batch):
        ids[row, : len(chunk)] = torch.from_numpy(chunk)
        mask[row, : len(chunk)] = 1
    ids, mask = ids.to(device), mask.to(device)
    with torch.no_grad():
        logits = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1]).logits.float()
    targets = ids[:, 1:]
    losses = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none"
    ).view(targets.shape)
    keep = mask[:, 1:].bool()
    return float(losses[keep].sum()), int(keep.sum())


def _summary(nll: float, tokens: int) -> dict:
    mean = nll / tokens if tokens else float("nan")
    return {"tokens": tokens, "nll": mean, "perplexity": math.exp(mean) if tokens else None}
