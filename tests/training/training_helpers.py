"""Helpers of the training tests: running the workflow in a working directory."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def _shared():
    """tests/support.py (or, in older checkouts, tests/conftest.py) under its own name."""
    root = Path(__file__).resolve().parents[1]
    path = root / "support.py" if (root / "support.py").exists() else root / "conftest.py"
    spec = importlib.util.spec_from_file_location("hpcllm_training_tests_shared", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_s = _shared()
REPO, make_workdir, run_snakemake, snakemake_bin = (
    _s.REPO,
    _s.make_workdir,
    _s.run_snakemake,
    _s.snakemake_bin,
)


def snakemake_cmd(workdir: Path, *args: str) -> list[str]:
    """The command ``run_snakemake`` runs, for tests that start Snakemake in the background."""
    return [snakemake_bin(), "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]
