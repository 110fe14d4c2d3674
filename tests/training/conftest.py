"""Tokenized sample data for the training tests, made once by the workflow's text stage."""

from __future__ import annotations

from pathlib import Path

import pytest
from training_helpers import make_workdir, run_snakemake

SOURCES = ("sample_en", "sample_multilingual", "fineweb")


@pytest.fixture(scope="session")
def text_workdir(tmp_path_factory) -> Path:
    """A working directory where the text stage has made the built-in config's data."""
    work = make_workdir(tmp_path_factory.mktemp("training") / "work")
    targets = [
        f"data/tokenized/sample_bpe/{s}_text_document.{ext}"
        for s in SOURCES
        for ext in ("bin", "idx")
    ]
    run_snakemake(
        work, "--profile", "profiles/local", *targets, "data/tokenizers/sample_bpe/vocab.json"
    )
    return work


@pytest.fixture(scope="session")
def data_prefixes(text_workdir) -> list[str]:
    return [str(text_workdir / f"data/tokenized/sample_bpe/{s}_text_document") for s in SOURCES]


@pytest.fixture(scope="session")
def vocab_file(text_workdir) -> str:
    return str(text_workdir / "data/tokenizers/sample_bpe/vocab.json")
