"""Passes over the data: how many times an experiment's plan reads each of its sources.

An experiment's tokens (segments x iterations x global batch x sequence length) come
from its sources in proportion to their blend weights. A plan that reads a source's
training documents thousands of times is nearly always a corpus that is a sample, not
the data meant (the laptop examples' 27-document FineWeb mirror under an 800M model).
The workflow states the passes of every experiment at plan time and refuses a plan over
``data.max_passes``. A source's tokens are exact where its merged dataset exists (its
.idx), else an upper estimate from its files' bytes where they are here (compressed
text: 4 tokens a byte at most, four times FineWeb's 2.9 bytes of Parquet a token, so
that a plan is never refused on an estimate it would pass), else unknown until it is
tokenized; prepare_data_cache, the CPU job before any training segment, checks the
exact figures then.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hpcllm.text.indexed_dataset import read_index
from hpcllm.training.plan.data import parse_split

COMPRESSED = (".zst", ".gz", ".parquet", ".bz2", ".xz")
TOKENS_PER_COMPRESSED_BYTE = 4


class TooManyPasses(ValueError):
    """A plan that reads a source more often than data.max_passes allows."""


@dataclass(frozen=True)
class SourceTokens:
    tokens: int | None  # None: not known before tokenization
    exact: bool


def dataset_tokens(prefix: str) -> SourceTokens | None:
    """The tokens of a merged dataset ``prefix`` (.idx) where it exists."""
    if os.path.exists(prefix + ".idx"):
        return SourceTokens(read_index(prefix + ".idx").num_tokens, True)
    return None


def files_tokens(files: Iterable[str]) -> SourceTokens:
    """An upper estimate of the tokens in text files from their sizes on disk."""
    total = 0
    for path in files:
        if not os.path.isfile(path):
            return SourceTokens(None, False)
        factor = TOKENS_PER_COMPRESSED_BYTE if path.endswith(COMPRESSED) else 1
        total += os.path.getsize(path) * factor
    return SourceTokens(total, False) if total else SourceTokens(None, False)


def planned_tokens(experiment: Mapping, global_batch: int) -> int:
    return (
        experiment["segments"]
        * experiment["iterations_per_segment"]
        * global_batch
        * experiment["model"]["seq_length"]
    )


def passes_report(
    name: str, experiment: Mapping, global_batch: int, sources: Mapping[str, SourceTokens]
) -> tuple[str, str | None]:
    """The plan's line on ``name``'s passes over its sources, and the refusal where a
    source's (estimated at most) passes exceed data.max_passes."""
    data = experiment["data"]
    weights = data["sources"]
    limit = data.get("max_passes", 10)
    train_share = parse_split(data.get("split", "98,2,0"))[0]
    planned = planned_tokens(experiment, global_batch)
    parts, over = [], []
    for source, weight in weights.items():
        known = sources.get(source) or SourceTokens(None, False)
        if not known.tokens:
            parts.append(f"{source}: size known once tokenized")
            continue
        share = planned * weight / sum(weights.values())
        passes = share / (known.tokens * train_share)
        kind = "" if known.exact else " (estimated from its files' bytes: at least)"
        parts.append(
            f"{source}: {share:,.0f} tokens over {known.tokens:,.0f} "
            f"({train_share:.0%} of them to train): {passes:,.2f} passes{kind}"
        )
        if passes > limit:
            over.append((source, passes, known))
    line = f"Passes over the data, {name} ({planned:,.0f} tokens): " + "; ".join(parts)
    if not over:
        return line, None
    source, passes, known = max(over, key=lambda o: o[1])
    problem = (
        f"training.experiments.{name} plans {planned:,.0f} tokens, {passes:,.0f} passes "
        f"over source {source} ({known.tokens:,.0f} tokens"
        f"{'' if known.exact else ' at most, from its files'}), more than "
        f"data.max_passes = {limit:g}: is {source} the corpus you meant (a sample, "
        f"max_documents, a mirror)? Point data.sources at your real data, train fewer "
        f"iterations, or, to repeat the data on purpose, set "
        f"training.experiments.{name}.data.max_passes: {int(passes) + 1} in a --configfile"
    )
    return line, problem


def blend_tokens(prepared) -> dict[str, SourceTokens]:
    """The exact tokens of each source of a prepared experiment's blend (its datasets
    exist: the job that reads them runs after the merges)."""
    names = list(prepared.experiment["data"]["sources"])
    out = {}
    for name, prefix in zip(names, prepared.blend.prefixes):
        known = dataset_tokens(prefix)
        if known is None:
            raise FileNotFoundError(f"{prefix}.idx: the merged dataset of source {name}")
        out[name] = known
    return out


def check_passes(name: str, prepared) -> str:
    """Raise TooManyPasses where the experiment reads a source more often than allowed;
    else the line stating its passes."""
    line, problem = passes_report(
        name, prepared.experiment, prepared.layout.global_batch, blend_tokens(prepared)
    )
    if problem:
        raise TooManyPasses(problem)
    return line
