"""make gpu-check's CPU part, end to end: the steps that run on a CPU pass at a tiny size,
the GPU-only ones are SKIP rows with their reason, a broken step is a FAIL row and the
exit status says so. (Its GPU part runs on a GPU machine: docs/gpu-check.md.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support import megatron_checkout

import hpcllm

SRC = str(Path(hpcllm.__file__).resolve().parents[1])
# The CPU steps that cover the path once (the canaries repeat these at a smaller size and
# have their own tests in tests/preflight); the Megatron steps skip without a GPU.
STEPS = ["probe", "data", "train_torch", "export_torch", "train_megatron", "export_megatron",
         "bench_language", "bench_vision"]  # fmt: skip
GPU_ONLY = ("train_megatron", "export_megatron")


def gpu_check(out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [sys.executable, "-m", "hpcllm.gpu_check", "--device", "cpu", "--out", str(out), *args],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip


def rows(out: Path) -> dict[str, dict]:
    return {r["step"]: r for r in json.loads((out / "figures.json").read_text())["steps"]}


def test_the_cpu_part_passes_and_skips_the_gpu_steps_with_a_reason(tmp_path):
    # a checkout at the pin is given: what skips is the GPU's absence
    megatron = megatron_checkout(tmp_path / "Megatron-LM")
    out = tmp_path / "check"
    proc = gpu_check(out, "--megatron", str(megatron), "--only", *STEPS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = rows(out)
    assert list(got) == STEPS
    for step in set(STEPS) - set(GPU_ONLY):
        assert got[step]["result"] == "PASS", got[step]
    for step in ("train_torch", "bench_language"):  # through the benchmark log parser
        assert got[step]["figures"]["tokens/s"] > 0
    assert got["bench_vision"]["figures"]["images/s"] > 0
    for step in GPU_ONLY:
        assert got[step]["result"] == "SKIP"
        assert got[step]["detail"].startswith("no GPU: Megatron-LM's training loop asserts CUDA")
    table = (out / "table.txt").read_text()
    assert table == proc.stdout[proc.stdout.index("hpcllm gpu-check on") :]
    results = {line.split()[0]: line.split()[1] for line in table.splitlines()[2:]}
    assert results == {step: row["result"] for step, row in got.items()}
    # the torch engine's checkpoint: saved by segment 1, resumed by segment 2
    seg2 = json.loads((out / "work/train/torch/seg2.json").read_text())
    assert seg2["resumed_from_iteration"] == 3 and seg2["last_iteration"] == 6


def test_a_broken_step_is_a_fail_row_and_the_exit_status(tmp_path):
    """A Megatron-LM tree that is not one: FAIL with the reason; the step after it runs."""
    out = tmp_path / "check"
    proc = gpu_check(out, "--megatron", str(tmp_path / "nowhere"), "--only", "train_megatron",
                     "data")  # fmt: skip
    assert proc.returncode == 1
    got = rows(out)
    assert got["train_megatron"]["result"] == "FAIL"
    assert (
        "no pretrain_gpt.py there; name a Megatron-LM checkout" in got["train_megatron"]["detail"]
    )
    assert got["data"]["result"] == "PASS"
