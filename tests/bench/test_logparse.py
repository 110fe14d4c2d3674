from datetime import datetime
from pathlib import Path

import pytest

from hpcllm.bench.logparse import parse_iteration_line, parse_megatron_log, parse_vision_log

DATA = Path(__file__).parent / "data"


def test_current_format_with_torchrun_prefixes_energy_and_glued_ranks():
    # megatron_current.log has the line format of the pinned core_v0.19.0
    # (megatron/training/training.py, training_log): its timestamp is strftime
    # '%Y-%m-%d %H:%M:%S.%f', with microseconds; the 2023 format without them is the next test.
    log = parse_megatron_log(DATA / "megatron_current.log")
    assert [i.iteration for i in log.iterations] == list(range(1, 11))  # 5 once, 0 skipped
    first, fifth = log.iterations[0], log.iterations[4]
    assert first.elapsed_s == pytest.approx(1.5767)
    assert first.tflops_per_gpu == pytest.approx(478.5)
    assert first.energy_j_per_gpu == pytest.approx(1576.7 * 0.65, abs=0.06)
    assert first.power_w_per_gpu == pytest.approx(650.1)
    assert first.global_batch_size == 16 and first.consumed_samples == 16
    assert first.lm_loss == pytest.approx(10.4)
    assert first.timestamp.microsecond > 0 and first.log_format == "current"
    assert fifth.elapsed_s == pytest.approx(3.0807)
    assert not log.truncated


def test_timestamp_without_microseconds_and_no_energy():
    log = parse_megatron_log(DATA / "megatron_2023.log")
    assert len(log.iterations) == 8
    it = log.iterations[2]
    assert it.timestamp == datetime(2026, 2, 6, 20, 55, 3)
    assert it.elapsed_s == pytest.approx(1.23)
    assert it.energy_j_per_gpu is None and it.tflops_per_gpu == pytest.approx(147.0)
    assert it.global_batch_size == 512


def test_old_format_seconds_and_tflops():
    log = parse_megatron_log(DATA / "megatron_old.log")
    assert [i.iteration for i in log.iterations] == list(range(1, 7))
    it = log.iterations[0]
    assert it.log_format == "old"
    assert it.elapsed_s == pytest.approx(105.23)
    assert it.tflops_per_gpu == pytest.approx(149.01)
    assert it.samples_per_s == pytest.approx(2048 / 105.23, rel=1e-3)
    assert it.timestamp is None and it.train_iters == 115311


def test_truncated_log_keeps_complete_lines_and_flags_the_cut():
    log = parse_megatron_log(DATA / "megatron_truncated.log")
    assert [i.iteration for i in log.iterations] == [1, 2, 3, 4]
    assert log.truncated


def test_log_without_iterations():
    log = parse_megatron_log(DATA / "no_iterations.log")
    assert log.iterations == [] and not log.truncated and log.lines == 4


def test_unrelated_and_malformed_lines_are_not_iterations():
    assert parse_iteration_line("iteration count is 5 | nothing") is None
    assert parse_iteration_line(" iteration 3/ 10 | consumed samples: 48 |") is None  # no time
    it = parse_iteration_line(
        " iteration 3/ 10 | elapsed time per iteration (ms): 5.0 | foo: bar |"
    )
    assert it.iteration == 3 and it.elapsed_s == pytest.approx(0.005)


def test_vision_json_lines(tmp_path):
    path = tmp_path / "run.log"
    path.write_text(
        "[default0]:some warning\n"
        '[default0]:{"event": "start", "world_size": 2}\n'
        '{"event": "batch", "epoch": 1, "batch": 0, "time_s": 0.5, "images": 8}\n'
        '{"event": "epoch", "epoch": 1, "epoch_time_s": 2.0, "train_time_s": 1.5, "images": 16}\n'
        '{"event": "batch", "epoch": 2, "batch": 0, "ti'
    )
    log = parse_vision_log(path)
    assert log.start == {"event": "start", "world_size": 2}
    assert len(log.batches) == 1 and len(log.epochs) == 1 and log.end is None
    assert log.truncated
