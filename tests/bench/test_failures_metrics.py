import math
from pathlib import Path

import pytest

from hpcllm.bench import metrics
from hpcllm.bench.logparse import Iteration, parse_megatron_log
from hpcllm.failures.classify import classify_log, classify_text

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize(
    "name, expected",
    [
        ("megatron_oom.log", "out_of_memory"),  # the NCCL error after it is a consequence
        ("megatron_nccl.log", "nccl_error"),
        ("slurm_node_failure.log", "node_failure"),
        ("slurm_time_limit.log", "time_limit"),
        ("megatron_current.log", None),
        ("no_iterations.log", None),
    ],
)
def test_classify_logs(name, expected):
    assert classify_log([DATA / name]) == expected


def test_slurm_state_wins_and_missing_logs_are_skipped(tmp_path):
    assert classify_text("NCCL error in: x", "NODE_FAIL") == "node_failure"
    assert classify_text("", "CANCELLED by 1234") == "cancelled"
    assert classify_text("", "TIMEOUT") == "time_limit"
    # Slurm's other states that name a cause (squeue/sacct state codes): a node that failed
    # to boot is a node failure (transient), a deadline a time limit
    assert classify_text("", "BOOT_FAIL") == "node_failure"
    assert classify_text("", "DEADLINE") == "time_limit"
    assert classify_text("", "OUT_OF_MEMORY") == "out_of_memory"
    assert classify_text("", "PREEMPTED") == "preempted"
    assert classify_text("Traceback (most recent call last):", "FAILED") == "error"
    assert classify_log([tmp_path / "absent.log"]) is None


def test_halved_throughput_gives_half_efficiency():
    assert metrics.efficiency_from_throughput(50.0, 100.0) == 0.5
    # fixed total work (a vision epoch): twice the GPUs, the same time -> 0.5; half -> 1
    assert metrics.efficiency_from_time(10.0, 8, 10.0, 4, "total") == 0.5
    assert metrics.efficiency_from_time(5.0, 8, 10.0, 4, "total") == 1.0
    # fixed work per GPU (a batch): time doubled -> 0.5
    assert metrics.efficiency_from_time(20.0, 8, 10.0, 4, "per_gpu") == 0.5
    assert math.isnan(metrics.efficiency_from_throughput(1.0, math.nan))
    with pytest.raises(ValueError, match="total"):
        metrics.efficiency_from_time(1, 1, 1, 1, "weak")


def test_language_metrics_exclude_warmup_and_use_dense_peak():
    its = [
        Iteration(
            iteration=i,
            train_iters=5,
            line=i,
            elapsed_s=t,
            tflops_per_gpu=f,
            global_batch_size=8,
            energy_j_per_gpu=e,
            lm_loss=5.0 - i,
        )
        for i, (t, f, e) in enumerate(
            [(9.0, 1.0, 900.0), (2.0, 400.0, 200.0), (2.0, 400.0, 200.0)], 1
        )
    ]
    m = metrics.language_run_metrics(its, warmup=1, gpus=4, seq_length=1024, peak_tflops=989.0)
    assert m["step_time_s"] == 2.0
    assert m["tokens_per_s"] == 8 * 1024 / 2.0
    assert m["tokens_per_s_per_gpu"] == 8 * 1024 / 2.0 / 4
    assert m["mfu"] == pytest.approx(400 / 989)
    assert m["energy_j_per_token"] == pytest.approx(200.0 * 4 / (8 * 1024))
    assert m["final_loss"] == 2.0 and m["iterations_measured"] == 2


def test_language_metrics_from_fixture():
    its = parse_megatron_log(DATA / "megatron_2023.log").iterations
    m = metrics.language_run_metrics(its, warmup=2, gpus=8, seq_length=2048, peak_tflops=312.0)
    assert m["step_time_s"] == pytest.approx(1.255)  # median of 1.23 .. 1.28
    assert m["tokens_per_s_per_gpu"] == pytest.approx(512 * 2048 / 1.255 / 8)
    assert math.isnan(m["energy_j_per_token"])


def test_vision_metrics_measured_epoch_and_trimmed_batches():
    batches = [{"epoch": 2, "time_s": t} for t in (5.0, 1.0, 2.0, 3.0, 0.1)]
    epochs = [
        {"epoch": 1, "images": 100, "epoch_time_s": 20.0, "train_time_s": 15.0},
        {"epoch": 2, "images": 100, "epoch_time_s": 12.0, "train_time_s": 10.0},
    ]
    m = metrics.vision_run_metrics(batches, epochs, measured_epoch=2, gpus=2)
    assert m["median_batch_time_s"] == 2.0  # 5.0 and 0.1 removed
    assert m["images_per_s_per_gpu"] == 100 / 10.0 / 2
    assert m["epoch_time_s"] == 12.0
    assert metrics.vision_run_metrics([], [], measured_epoch=4, gpus=1) == {"epochs_logged": 0}


def test_epicure_timings_from_a_synthetic_clock():
    # epoch starts at 100; batches start at 100.5, 101, 103, 104, 107 (the first waits
    # 0.5 s for its data); training ends at 108, validation at 110.5
    t = metrics.epoch_timings(100.0, [100.5, 101.0, 103.0, 104.0, 107.0], 108.0, 110.5)
    assert t["t_ep"] == 10.5  # validation included
    assert t["t_tr"] == 8.0
    # each batch from its start to the next one's: loading of the next batch included
    assert t["batch_times"] == [0.5, 2.0, 1.0, 3.0, 1.0]
    assert sum(t["batch_times"]) == 108.0 - 100.5
    # the CDF and the median leave out the first and the last batch
    assert metrics.batch_times_trimmed(t["batch_times"]) == [2.0, 1.0, 3.0]
    assert metrics.median(metrics.batch_times_trimmed(t["batch_times"])) == 2.0
    with pytest.raises(ValueError, match="end of training"):
        metrics.epoch_timings(100.0, [101.0], 112.0, 110.0)


def test_vision_run_metrics_from_epicure_records():
    batches = [{"epoch": 2, "time_s": t} for t in (5.0, 1.0, 2.0, 3.0, 0.1)]
    epochs = [
        {"epoch": 1, "images": 100, "epoch_time_s": 20.0, "train_time_s": 15.0},
        {
            "epoch": 2,
            "images": 100,
            "epoch_time_s": 12.0,
            "train_time_s": 10.0,
            "val_time_s": 2.0,
            "val_top1": 0.25,
            "val_top5": 0.75,
            "val_images": 40,
            "energy_j": 800.0,
            "energy_j_per_gpu": 400.0,
            "energy_j_per_image": 8.0,
        },
    ]
    m = metrics.vision_run_metrics(batches, epochs, measured_epoch=2, gpus=2)
    assert (m["epoch_time_s"], m["train_time_s"], m["val_time_s"]) == (12.0, 10.0, 2.0)
    assert m["median_batch_time_s"] == 2.0  # 5.0 and 0.1 removed
    assert (m["val_top1"], m["val_top5"], m["val_images"]) == (0.25, 0.75, 40)
    assert (m["energy_j"], m["energy_j_per_gpu"], m["energy_j_per_image"]) == (800, 400, 8)
    # no counters, no val split: the fields exist and are empty
    m1 = metrics.vision_run_metrics(batches, epochs, measured_epoch=1, gpus=2)
    assert all(math.isnan(m1[k]) for k in ("energy_j", "energy_j_per_gpu", "val_top1"))
