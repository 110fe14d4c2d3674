"""The workflow passes Snakemake's own linter and the formatters `make lint` runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import REPO, hang_guard

BIN = Path(sys.executable).parent


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=hang_guard(20)
    )  # ~20 s


def test_snakemake_lint_finds_nothing():
    proc = run(str(BIN / "snakemake"), "--lint")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_snakefmt_and_ruff_leave_the_sources_unchanged():
    for argv in (
        ("snakefmt", "--check", "Snakefile", "workflow/rules"),
        ("ruff", "check", "src", "tests", "benchmarks", "workflow/scripts"),
        ("ruff", "format", "--check", "src", "tests", "benchmarks", "workflow/scripts"),
    ):
        proc = run(str(BIN / argv[0]), *argv[1:])
        assert proc.returncode == 0, f"{' '.join(argv)}:\n{proc.stdout}{proc.stderr}"
