"""Helpers shared by the tests: the repository, and running Snakemake on a copy of it.

Imported as ``from support import ...`` (tests/ is on pytest's pythonpath). Not in a
conftest.py: every test folder has one, and ``import conftest`` finds whichever pytest
loaded last."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def snakemake_bin() -> str:
    path = BIN / "snakemake"
    return str(path) if path.exists() else "snakemake"


def make_workdir(path: Path) -> Path:
    """A working directory that sees the workflow's config/ and resources/ as a user's would."""
    path.mkdir(parents=True, exist_ok=True)
    for name in ("config", "resources", "profiles"):
        if not (path / name).exists():
            (path / name).symlink_to(REPO / name)
    return path


def run_snakemake(
    workdir: Path,
    *args: str,
    check: bool = True,
    env: dict[str, str] | None = None,
    timeout: int = 900,
) -> subprocess.CompletedProcess:
    """Run the workflow's Snakefile in ``workdir``; output is captured and shown on failure."""
    cmd = [snakemake_bin(), "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]
    full_env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    proc = subprocess.run(
        cmd, cwd=workdir, capture_output=True, text=True, env=full_env, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"snakemake failed ({proc.returncode}): {' '.join(cmd)}\n"
            f"--- stdout\n{proc.stdout[-8000:]}\n--- stderr\n{proc.stderr[-8000:]}"
        )
    return proc


def have(command: str) -> bool:
    return shutil.which(command) is not None


def megatron_hf_tokenizer(folder: str | os.PathLike):
    """Megatron Core's tokenizer of ``folder``, made as Megatron-LM's build_tokenizer makes
    it for ``--tokenizer-type HuggingFaceTokenizer --tokenizer-model FOLDER``."""
    from megatron.core.tokenizers import MegatronTokenizer

    return MegatronTokenizer.from_pretrained(
        tokenizer_path=str(folder),
        metadata_path={"library": "huggingface"},
        chat_template=None,
        vocab_file=None,
        merges_file=None,
        additional_special_tokens=[],
        use_fast=True,
        trust_remote_code=False,
        include_special_tokens=True,
    )
