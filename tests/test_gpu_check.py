"""make gpu-check's CPU part, end to end: the steps that run on a CPU pass at a tiny size,
the GPU-only ones are SKIP rows with their reason, a broken step is a FAIL row and the
exit status says so. (Its GPU part runs on a GPU machine: docs/gpu-check.md.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
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
    # the train row's detail: segment 2's iteration-time spread (calendar's percentiles)
    spread = got["train_torch"]["figures"]
    assert spread["p10/median"] <= 1.0 <= spread["p90/median"]
    assert spread["segment 2/1 median"] > 0
    assert got["train_torch"]["detail"].startswith("segment 2 s/iteration p10 ")
    # the probe's record, where the segments read what the image can run (its resiliency)
    record = json.loads((out / "work/results/preflight/local/probe/bare.json").read_text())
    assert record["cluster"] == "local" and "gpu_sensors" in record["inside"]["resiliency"]
    assert any(check["check"] == "resiliency" for check in record["checks"])
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


# --- the train rows' detail: Megatron's straggler detector and the iteration-time spread ---


def iteration_line(iteration: int, ms: float) -> str:
    """An iteration line as both engines log it (Megatron's format)."""
    return (
        f" [2026-11-28 20:00:00] iteration {iteration:8d}/      40 | consumed samples: "
        f"{32 * iteration:10d} | elapsed time per iteration (ms): {ms:.1f} | "
        "lm loss: 7.000000E+00 | loss scale: 1.0 | number of skipped iterations:   0 |\n"
    )


def megatron_check(tmp_path: Path):
    from hpcllm import gpu_check as g

    return g, g.Check("cpu", g.this_machine("cpu", None), tmp_path, None, g.SIZES["cpu"])


def probe_inside(gpu_sensors: str | None) -> dict:
    """What hpcllm.preflight.inside reports of an image whose Megatron-LM has the option."""
    return {"modules": {}, "resiliency": {
        "nvidia_resiliency_ext": None, "nvrx_inprocess": False, "gpu_sensors": gpu_sensors,
        "megatron": {"log_straggler": True, "inprocess_restart": True}}}  # fmt: skip


def test_the_probe_record_decides_megatrons_straggler_detector(tmp_path, monkeypatch):
    """The segments' own decision (straggler_log_on) reads the record the probe step
    writes where they look for it; the row says why the detector is off."""
    from types import SimpleNamespace

    monkeypatch.chdir(tmp_path)  # the record's path is relative, as in a workflow's folder
    g, c = megatron_check(tmp_path)
    prepared = SimpleNamespace(experiment={"engine": "megatron", "resiliency": "auto"})
    on, why = g.straggler_decision(c, prepared)
    assert not on and why.startswith("no site probe record")
    g.write_probe_record(c, ["torch"], [], probe_inside(None))
    on, why = g.straggler_decision(c, prepared)
    assert not on and "no GPU sensor binding (pynvml" in why
    assert g.straggler_outcome(on, why, [])[1].startswith("straggler detector off: in Megatron")
    path = g.write_probe_record(c, ["torch"], [], probe_inside("pynvml"))
    assert str(path) == "results/preflight/local/probe/bare.json" and path.is_file()
    on, why = g.straggler_decision(c, prepared)
    assert on and why.startswith("available (GPU sensors through pynvml); the site probe")
    prepared.experiment["resiliency"] = "off"
    on, why = g.straggler_decision(c, prepared)
    assert not on and why.startswith("resiliency: off;")


def test_the_straggler_row_reads_megatrons_reports_on_one_gpu(tmp_path):
    """Megatron's own report lines for one GPU (--straggler-minmax-count 1: the min/max
    line alone, no rank lists), read back by megatron_stragglers into the row."""
    from training.test_megatron_stragglers import megatron_report  # needs megatron-core

    g = megatron_check(tmp_path)[0]
    logs = []
    for k, ms in ((1, 812.5), (2, 790.25)):
        log = tmp_path / f"seg{k}.engine.log"
        text = "".join(iteration_line(20 * (k - 1) + i, ms + 1) + megatron_report({0: ms}, 1)
                       for i in (1, 2, 3))  # fmt: skip
        assert "^^^^" not in text  # one rank: no lists
        log.write_text(text)
        logs.append(log)
    figures, detail = g.straggler_outcome(True, "available (GPU sensors through pynvml)", logs)
    assert figures == {"straggler reports": 6.0, "lowest relative throughput": 1.0}
    assert detail == (
        "straggler detector on (available (GPU sensors through pynvml)): 6 reports read of 6 "
        "printed (segments 3+3); newest: forward 790.2 ms/iteration (rank 0) to 790.2 "
        "(rank 0), estimated throughput over the median (379.63 TF) by rank {0: 1.00}"
    )
    # on, and nothing read: a FAIL naming the logs
    bare = tmp_path / "bare.engine.log"
    bare.write_text(iteration_line(1, 800.0) + "[2026-11-28] | MnRtt/Rnk: garbled\n")
    with pytest.raises(RuntimeError, match=r"read no report .*\(1 lines with 'MnRtt/Rnk'\)"):
        g.straggler_outcome(True, "available", [bare])


def test_the_iteration_time_spread_of_segment_2(tmp_path):
    """p10 and p90 of segment 2's seconds per iteration over its median (calendar's
    percentiles), the warm-up left out, and segment 2's median over segment 1's."""
    g = megatron_check(tmp_path)[0]
    seg1, seg2 = tmp_path / "seg1.engine.log", tmp_path / "seg2.engine.log"
    seg1.write_text("".join(iteration_line(i, ms) for i, ms in enumerate([9000, 200, 210, 190], 1)))
    times2 = [7000, 110, 90, 100, 100, 95, 100, 100, 100, 100, 105, 100]  # warm-up first
    seg2.write_text("".join(iteration_line(20 + i, ms) for i, ms in enumerate(times2, 1)))
    figures, text = g.iteration_spread([seg1, seg2], warmup=1)
    # 11 measured: sorted 90, 95, 100 x 7, 105, 110; calendar's p10 is the 2nd, p90 the 10th
    assert figures == pytest.approx(
        {"p10/median": 0.95, "p90/median": 1.05, "segment 2/1 median": 0.5}
    )
    assert text == (
        "segment 2 s/iteration p10 0.950 and p90 1.050 of its median 0.1 s; median over "
        "segment 1's 0.500"
    )
    seg2.write_text("no iteration lines\n")
    with pytest.raises(RuntimeError, match="seg2.engine.log: no iteration times"):
        g.iteration_spread([seg1, seg2], warmup=1)
