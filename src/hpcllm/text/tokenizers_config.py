"""Tokenizers as the config describes them: trained here, or existing files."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from hpcllm.text.tokenization import check_tokenizer, load_tokenizer, tokenizer_from_gpt2_files


def tokenizer_files(name: str, cfg: dict[str, Any]) -> list[str]:
    """The files a tokenizer is loaded from (inputs of the rules that use it)."""
    if cfg["type"] == "train":
        return [f"data/tokenizers/{name}/tokenizer.json"]
    if cfg.get("tokenizer_json"):
        return [cfg["tokenizer_json"]]
    return [cfg["vocab_file"], cfg["merges_file"]]


def retrain_warning(
    name: str,
    cfg: dict[str, Any],
    sources: Iterable[str],
    shards_of: Callable[[str], list[str]],
    exists: Callable[[str], bool] = os.path.exists,
) -> str | None:
    """Why a trained tokenizer that trains on every source will be trained again: a source
    with no shard yet (one just added) is new training data. Snakemake says only "Set of
    input files has changed"; this names the sources and the pin that keeps the tokenizer.
    """
    if cfg["type"] != "train" or cfg.get("sources"):
        return None
    if not exists(f"data/tokenizers/{name}/tokenizer.json"):
        return None
    sources = list(sources)
    new = [s for s in sources if not any(exists(p) for p in shards_of(s))]
    if not new:
        return None
    old = [s for s in sources if s not in new]
    return (
        f"text.tokenizers.{name} trains on every source (it has no sources:), and "
        f"{', '.join(new)} {'is' if len(new) == 1 else 'are'} new (no shard downloaded yet): "
        f"{name} will be trained again, every dataset tokenized with it made again, and the "
        "training runs and benchmarks that read them rerun. To keep the trained tokenizer, "
        f"pin the sources it was trained on: text.tokenizers.{name}.sources: "
        f"[{', '.join(old)}] (in your --configfile)"
    )


def gpt2_files(name: str, cfg: dict[str, Any]) -> tuple[str, str]:
    """The GPT-2 style ``vocab.json`` and ``merges.txt`` of a tokenizer, for the engines
    (Megatron's GPT2BPETokenizer): trained ones from ``train_tokenizer``, given ones
    exactly as the config names them (never a freshly trained stand-in)."""
    if cfg.get("type", "train") == "train":
        return f"data/tokenizers/{name}/vocab.json", f"data/tokenizers/{name}/merges.txt"
    if cfg.get("vocab_file") and cfg.get("merges_file"):
        return cfg["vocab_file"], cfg["merges_file"]
    raise ValueError(
        f"text.tokenizers.{name}: training and benchmarks read GPT-2 style vocab.json + "
        f"merges.txt, but this tokenizer names only tokenizer_json ({cfg['tokenizer_json']}); "
        "set vocab_file and merges_file (e.g. saved from it with "
        "tokenizers' model.save) or train one (type: train)"
    )


def tokenizer_for(cfg: dict[str, Any], files: list[str] | str):
    """Load a tokenizer from its files, checked against the configured vocabulary.

    A trained tokenizer is checked for its end-of-document token only (a small corpus
    can give fewer tokens than ``vocab_size`` asked for); given files are checked
    against ``vocab_size`` too when the config sets it.
    """
    files = [files] if isinstance(files, str) else list(files)
    vocab_size = cfg.get("vocab_size") if cfg["type"] == "files" else None
    if len(files) == 1:
        return load_tokenizer(files[0], vocab_size, cfg["eod_token"])
    tok = check_tokenizer(
        tokenizer_from_gpt2_files(files[0], files[1]), files[0], vocab_size, cfg["eod_token"]
    )
    # As in tokenizer.json (and HF's GPT-2 tokenizer), the end-of-document token is special:
    # its literal text in a document maps to its id, so both forms give the same ids.
    tok.add_special_tokens([cfg["eod_token"]])
    return tok
