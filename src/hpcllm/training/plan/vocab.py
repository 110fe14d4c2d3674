"""At plan time: ``model.vocab_size``, where an experiment (or its preset) sets it, is the
vocabulary its tokenizer gives. The engines size the embedding by the tokenizer (padded to
a multiple of 128), so another ``model.vocab_size`` would only make the memory estimate
and the FLOPs silently those of another model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def tokenizer_size(tok: str, cfg: dict[str, Any], workdir: str = ".") -> tuple[int, str] | None:
    """The tokenizer's vocabulary and where it comes from: its files where they exist
    already (what the engines read), else the config's ``vocab_size``; None when neither
    is known yet."""
    from hpcllm.text.tokenizers_config import TokenizerError, engine_files, engine_vocabulary

    files = engine_files(tok, cfg)
    if all(Path(workdir, f).is_file() for f in files):
        eod = cfg.get("eod_token", "<|endoftext|>")
        try:
            size, _ = engine_vocabulary([os.path.join(workdir, f) for f in files], eod)
            return size, files[0]
        except TokenizerError:
            pass  # the segment refuses a broken tokenizer with its own message
    if cfg.get("vocab_size"):
        return int(cfg["vocab_size"]), f"text.tokenizers.{tok}.vocab_size"
    return None


def check_vocab_size(
    name: str, exp: dict[str, Any], tok: str, cfg: dict[str, Any], workdir: str = "."
) -> None:
    """Refuse a ``model.vocab_size`` that pads to another size than the tokenizer's
    (ValueError naming the key, the tokenizer's size and where it comes from)."""
    from hpcllm.models.planner import pad_vocab

    wanted = exp["model"].get("vocab_size")
    known = tokenizer_size(tok, cfg, workdir) if wanted else None
    if known is None or pad_vocab(wanted, 1) == pad_vocab(known[0], 1):
        return
    size, source = known
    raise ValueError(
        f"training.experiments.{name}.model.vocab_size: {wanted}, but its tokenizer "
        f"'{tok}' has {size} tokens ({source}). The engines size the embedding by the "
        "tokenizer, so the memory estimate would be that of another model. Set "
        f"model.vocab_size: null (the tokenizer's, padded to a multiple of 128) or {size}"
    )
