"""The exported model folder an evaluation reads."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


class EvaluationError(ValueError):
    """Evaluation input that is missing or unusable; the message says what to do."""


def model_folder(export_record: str | os.PathLike) -> Path:
    """The folder transformers loads, beside ``export_record`` (the export stage's
    export.json): the record's own folder when it holds config.json, else its one
    subfolder that does."""
    here = Path(export_record).parent
    if (here / "config.json").is_file():
        return here
    found = sorted(p.parent for p in here.glob("*/config.json"))
    if len(found) != 1:
        raise EvaluationError(
            f"{export_record}: no single Hugging Face model folder (with config.json) "
            f"beside it ({len(found)} found). Run the export again: "
            f"snakemake --forcerun {export_record}"
        )
    return found[0]


def file_digest(path: str | os.PathLike) -> str:
    """What identifies the export an evaluation read: a new export is another model."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def device(requested: str = "auto") -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested
