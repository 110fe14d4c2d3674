"""Tokenized sample data for the training tests, made once by the workflow's text stage."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def _root_conftest():
    """tests/conftest.py under its own name (``import conftest`` may find another one)."""
    path = Path(__file__).resolve().parents[1] / "conftest.py"
    spec = importlib.util.spec_from_file_location("hpcllm_tests_root_conftest_training", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_root = _root_conftest()
make_workdir, run_snakemake = _root.make_workdir, _root.run_snakemake


def snakemake_cmd(workdir: Path, *args: str) -> list[str]:
    """The command ``run_snakemake`` runs, for tests that start Snakemake in the background."""
    return [_root.snakemake_bin(), "-s", str(_root.REPO / "Snakefile"), "-d", str(workdir), *args]


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
