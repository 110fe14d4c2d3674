"""Energy per token in training: the engines' log lines carry the GPUs' energy (Megatron's
--log-energy field; the torch engine prints the same where its GPUs have counters), and
segment records, `hpcllm status` and the results page turn it into Wh per million tokens.
(Here in tests/evaluation with the rest of issue 34; no GPU here: the lines are written.)"""

from __future__ import annotations

import argparse
import re

import pytest

from hpcllm.bench.energy import log_energy, wh_per_million_tokens
from hpcllm.bench.logparse import parse_iteration_line
from hpcllm.training.campaign import status
from hpcllm.training.engines.log_lines import parse_log_lines
from hpcllm.training.engines.torch_engine import log_line

ARGS = argparse.Namespace(train_iters=30, global_batch_size=8)


def line(iteration: int, energy: float | None) -> str:
    return log_line(iteration, ARGS, 8 * iteration, 2000.0, 0.0, 1e-4, 5.0, 1.0, False,
                    energy_j_per_gpu=energy)  # fmt: skip


def test_torch_engine_lines_carry_energy_as_megatron_prints_it():
    rows = parse_log_lines(line(12, 1200.0) + "\n" + line(13, None) + "\n")
    assert rows[0]["energy per GPU (J/iter/GPU)"] == 1200.0
    assert rows[0]["power per GPU (W/GPU)"] == 600.0  # 1200 J in 2 s
    assert "energy per GPU (J/iter/GPU)" not in rows[1]  # no counter: no field
    bench = parse_iteration_line(line(12, 1200.0))  # the benchmarks' reader agrees
    assert bench.energy_j_per_gpu == 1200.0


def test_energy_sums_each_lines_iterations_over_the_gpus():
    rows = [
        {"iteration": 2, "energy per GPU (J/iter/GPU)": 100.0},
        {"iteration": 4, "energy per GPU (J/iter/GPU)": 200.0},
        {"iteration": 3, "energy per GPU (J/iter/GPU)": 300.0},  # a resumed attempt
        {"iteration": 5},  # no counter: neither its energy nor its tokens count
    ]
    joules, tokens = log_energy(rows, gpus=4, global_batch=8, seq_length=64, log_interval=2)
    assert joules == (100 * 2 + 200 * 2 + 300 * 2) * 4
    assert tokens == 6 * 8 * 64
    assert wh_per_million_tokens(3600.0, 1_000_000) == 1.0
    assert log_energy([{"iteration": 1}], 1, 8, 64, 1) is None


def test_status_shows_wh_per_million_tokens(tmp_path):
    """tiny_local of the laptop examples at iteration 14, its log lines with energy."""
    save = tmp_path / "checkpoints" / "tiny_local"
    (save / "iter_0000014").mkdir(parents=True)
    (save / "latest_checkpointed_iteration.txt").write_text("14")
    (tmp_path / "results/train/tiny_local").mkdir(parents=True)
    (tmp_path / "results/train/tiny_local/seg1.json").write_text("{}")
    logs = tmp_path / "logs/train_segment/tiny_local"
    logs.mkdir(parents=True)
    (logs / "seg2.engine.log").write_text("".join(line(i, 360.0) + "\n" for i in range(11, 15)))
    out = status.campaign_status(tmp_path, profile="profiles/local", jobs=[])
    shown = float(re.search(r"([\d.,]+) Wh per million tokens", out).group(1).replace(",", ""))
    # 4 lines x 360 J x 1 process = 0.4 Wh over 4 x 8 x 64 tokens (the tiny preset)
    assert shown == pytest.approx(round(0.4 / (4 * 8 * 64 / 1e6), 1)), out
    # without counters (a CPU run) nothing is claimed
    (logs / "seg2.engine.log").write_text("".join(line(i, None) + "\n" for i in range(11, 15)))
    assert "Wh per million tokens" not in status.campaign_status(
        tmp_path, profile="profiles/local", jobs=[]
    )
