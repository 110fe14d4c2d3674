"""Helpers shared by the tests: the repository, and running Snakemake on a copy of it.

Imported as ``from support import ...`` (tests/ is on pytest's pythonpath). Not in a
conftest.py: every test folder has one, and ``import conftest`` finds whichever pytest
loaded last."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# Time limits in tests guard against hangs; they never check speed. Each call site states
# what the step takes on a quiet 2-core machine; the limit is HANG_GUARD_FACTOR times that
# (at least MIN_HANG_GUARD). A suite run beside 8 busy processes (load 10-17 on 2 cores)
# took steps up to ~8 times longer than on a quiet machine, so 20 leaves a wide margin.
HANG_GUARD_FACTOR = 20
MIN_HANG_GUARD = 120.0


def hang_guard(expected_seconds: float) -> float:
    """The time limit of a step expected to take ``expected_seconds`` on a quiet machine."""
    return max(MIN_HANG_GUARD, HANG_GUARD_FACTOR * expected_seconds)


# The laptop examples (sample corpus, tiny models): config/config.yaml is a user's clean
# config, and the tests, like profiles/local, run the examples over it.
EXAMPLES = REPO / "config" / "examples" / "local.yaml"


def with_examples(args: Sequence[str]) -> list[str]:
    """``args`` with the examples first in the --configfile list (Snakemake keeps only the
    last --configfile's files, so they join the test's list), else as --configfile=EXAMPLES
    (one value: a target after it stays a target)."""
    args = list(args)
    for i, arg in enumerate(args):
        if arg == "--configfile":
            return [*args[: i + 1], str(EXAMPLES), *args[i + 1 :]]
        if arg.startswith("--configfile="):
            return [*args[:i], "--configfile", str(EXAMPLES), arg.split("=", 1)[1], *args[i + 1 :]]
    return [f"--configfile={EXAMPLES}", *args]


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
    timeout: float | None = None,
    examples: bool = True,
) -> subprocess.CompletedProcess:
    """Run the workflow's Snakefile in ``workdir``; output is captured and shown on failure.

    ``examples``: with the laptop examples (config/examples/local.yaml) over the config.
    ``timeout`` is a hang guard; by default that of a run of the built-in workflow (about
    60 s on a quiet 2-core machine)."""
    args = with_examples(args) if examples else list(args)
    cmd = [snakemake_bin(), "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]
    full_env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    proc = subprocess.run(
        cmd,
        cwd=workdir,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout or hang_guard(60),
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


@contextlib.contextmanager
def small_file_system(path: Path, size: str) -> Iterator[Path]:
    """A real file system of ``size`` mounted at ``path`` (tmpfs: needs root, which the
    test suite has; skipped where mounting is refused). A file is left in it, so that
    Snakemake's clean-up of a failed job's empty folders does not try to remove it."""
    path.mkdir(parents=True, exist_ok=True)
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs to fill ({mount.stderr.strip()}): needs root")
    try:
        (path / "mount-point").write_text("a small tmpfs of the test\n")
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def planned(out: str) -> dict[str, int]:
    """Jobs per rule in the "Job stats" table of a Snakemake plan's output."""
    table = out.split("Job stats:", 1)[1].split("total", 1)[0] if "Job stats:" in out else ""
    rows = (line.split() for line in table.splitlines())
    return {row[0]: int(row[1]) for row in rows if len(row) == 2 and row[1].isdigit()}


def megatron_checkout(tree: Path, version: str = "0.19.1") -> Path:
    """The files by which a Megatron-LM checkout is known (an archive: no .git)."""
    import sysconfig

    datasets = tree / "megatron" / "core" / "datasets"
    datasets.mkdir(parents=True)
    (tree / "pretrain_gpt.py").write_text("")
    major, minor, patch = version.split(".")
    (tree / "megatron/core/package_info.py").write_text(
        f"MAJOR = {major}\nMINOR = {minor}\nPATCH = {patch}\n"
    )
    (datasets / f"helpers_cpp{sysconfig.get_config_var('EXT_SUFFIX')}").write_bytes(b"")
    return tree


def tiny_local_prepared(workdir: Path, clusters: Path | None = None):
    """tiny_local of the laptop examples prepared as `hpcllm status` prepares it in
    ``workdir`` (its cluster file from ``clusters``, default the workdir's)."""
    from hpcllm.clusters import load_cluster
    from hpcllm.training.campaign.status import load_config
    from hpcllm.training.plan.experiment import prepare_experiment

    config = load_config(workdir, [str(EXAMPLES)], "profiles/local")
    return prepare_experiment(
        "tiny_local",
        config["training"]["experiments"]["tiny_local"],
        config["text"],
        load_cluster("local", clusters or workdir / "config" / "clusters"),
    )
