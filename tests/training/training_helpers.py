"""Helpers of the training tests: running the workflow in a working directory."""

from __future__ import annotations

from pathlib import Path

from support import REPO, make_workdir, run_snakemake, snakemake_bin, with_examples  # noqa: F401


def snakemake_cmd(workdir: Path, *args: str) -> list[str]:
    """The command ``run_snakemake`` runs, for tests that start Snakemake in the background."""
    args = with_examples(args)
    return [snakemake_bin(), "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]
