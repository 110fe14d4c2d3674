"""The torch engine on real sample data: exact resume (dropout on, every random state),
signals, log format, bad input."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from support import hang_guard

from hpcllm.training.campaign import signal_lead
from hpcllm.training.checkpoints import tracker as checkpoints
from hpcllm.training.checkpoints.tracker import CheckpointError
from hpcllm.training.engines.torch_engine import main, parser, train
from hpcllm.training.plan.data import DataError

ITERS = 12


def engine_argv(save: Path, prefixes, vocab_file, *extra: str) -> list[str]:
    return [
        "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
        "--train-iters", str(ITERS), "--lr", "3e-3", "--min-lr", "3e-4",
        "--lr-warmup-iters", "2", "--adam-beta2", "0.95", "--weight-decay", "0.1",
        "--data-path", "0.6", prefixes[0], "0.4", prefixes[1], "--split", "98,2,0",
        "--data-cache-path", str(save.parent / "cache"), "--vocab-file", vocab_file,
        "--save", str(save), "--load", str(save), "--save-interval", "100",
        "--log-interval", "1", "--log-throughput", "--threads", "1", "--exit-signal-handler",
        "--eval-interval", "4", "--eval-iters", "1",
        # the model draws random numbers while it trains: a resume must restore them
        "--hidden-dropout", "0.1", "--attention-dropout", "0.1",
        *extra,
    ]  # fmt: skip


def run_in_process(argv: list[str]) -> dict:
    try:
        return train(parser().parse_args(argv))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def final_weights(save: Path) -> dict[str, torch.Tensor]:
    it = checkpoints.latest_iteration(save)
    state = torch.load(checkpoints.model_file(save, it), map_location="cpu", weights_only=False)
    return {
        "iteration": it,
        **state["model"],
        **{f"opt{k}": v for k, v in _flat(state["optimizer"])},
        **{f"rng.{k}": v for k, v in _rng(state["rng_state"][0])},
    }


def _rng(rng: dict):
    """Python's, NumPy's and torch's generator states, comparable with == or torch.equal."""
    yield "random", rng["random"]
    name, keys, pos, has_gauss, gauss = rng["np"]
    yield "np", (name, keys.tolist(), pos, has_gauss, gauss)
    yield "torch", rng["torch"]


def _flat(opt_state):
    for pid, st in opt_state["state"].items():
        for key, value in st.items():
            yield f"{pid}.{key}", value


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), f"{key} differs"
        else:
            assert a[key] == b[key], key


@pytest.fixture(scope="module")
def one_segment(tmp_path_factory, data_prefixes, vocab_file) -> dict:
    save = tmp_path_factory.mktemp("one") / "ckpt"
    summary = run_in_process(engine_argv(save, data_prefixes, vocab_file))
    assert summary["complete"] and summary["last_iteration"] == ITERS
    return final_weights(save)


def test_three_segments_equal_one_bitwise(tmp_path, data_prefixes, vocab_file, one_segment):
    save = tmp_path / "ckpt"
    for stop in (4, 8, 12):
        summary = run_in_process(
            engine_argv(save, data_prefixes, vocab_file, "--exit-interval", str(stop))
        )
        assert summary["first_iteration"] == stop - 3 and summary["last_iteration"] == stop
    assert sorted(checkpoints.iteration_dirs(save)) == [4, 8, 12]
    assert_bitwise_equal(final_weights(save), one_segment)


def test_a_kill_between_saves_resumes_bitwise(tmp_path, data_prefixes, vocab_file, one_segment):
    """SIGKILL (no save) after iteration 6 of 12 is logged, checkpoints every 2: the resume
    from the newest checkpoint ends bitwise equal to the uninterrupted run, weights,
    optimizer and every generator's state, with dropout drawing all along."""
    save = tmp_path / "ckpt"
    log = tmp_path / "engine.log"
    argv = [sys.executable, "-m", "hpcllm.training.engines.torch_engine"] + engine_argv(
        save, data_prefixes, vocab_file, "--save-interval", "2"
    )
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.time() + hang_guard(10)  # iteration 6: ~10 s quiet
        while "iteration        6/" not in log.read_text():
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.02)
        proc.kill()
        proc.wait()
    killed_at = checkpoints.latest_iteration(save)
    assert killed_at is not None and killed_at < ITERS, log.read_text()[-2000:]
    summary = run_in_process(engine_argv(save, data_prefixes, vocab_file))
    assert summary["first_iteration"] == killed_at + 1 and summary["complete"]
    assert_bitwise_equal(final_weights(save), one_segment)


LONG = 80  # iterations of the signal test: far more than run before the signal lands


@pytest.fixture(scope="module")
def long_run(tmp_path_factory, data_prefixes, vocab_file) -> dict:
    save = tmp_path_factory.mktemp("long") / "ckpt"
    argv = engine_argv(save, data_prefixes, vocab_file, "--train-iters", str(LONG))
    assert run_in_process(argv)["complete"]
    return final_weights(save)


def test_signal_saves_and_resume_is_exact(tmp_path, data_prefixes, vocab_file, long_run):
    """SIGUSR2 (Slurm's --signal of a segment job) mid-run: the iteration finishes, a
    checkpoint is saved, exit 0, incomplete; the save's time logged as Megatron logs it.

    The signal is sent once iteration 3 is logged; wherever in the 80 iterations it
    lands, the engine stops at the next iteration's end, saves it, and the resumed run
    ends bitwise equal to the uninterrupted one."""
    save = tmp_path / "ckpt"
    log = tmp_path / "engine.log"
    argv = [sys.executable, "-m", "hpcllm.training.engines.torch_engine"] + engine_argv(
        save, data_prefixes, vocab_file, "--train-iters", str(LONG)
    )
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.time() + hang_guard(10)  # iteration 3: ~10 s quiet
        while "iteration        3/" not in log.read_text():
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR2)
        assert proc.wait(timeout=hang_guard(10)) == 0, log.read_text()[-3000:]  # ~10 s quiet
    text = log.read_text()
    assert signal_lead.save_seconds(text) is not None, text[-2000:]
    stopped = checkpoints.latest_iteration(save)
    assert 3 <= stopped < LONG, text[-2000:]
    assert f"exiting at iteration {stopped} (signal)" in text
    assert f"iteration {stopped + 1:8d}/" not in text
    summary = run_in_process(
        engine_argv(save, data_prefixes, vocab_file, "--train-iters", str(LONG))
    )
    assert summary["first_iteration"] == stopped + 1 and summary["complete"]
    assert_bitwise_equal(final_weights(save), long_run)


def test_signal_during_start_up_ends_cleanly(tmp_path, data_prefixes, vocab_file):
    """A signal while torch is still being imported: nothing trained, nothing written,
    exit 0 and the line that says so; the rerun starts from the last checkpoint."""
    save = tmp_path / "ckpt"
    run_in_process(engine_argv(save, data_prefixes, vocab_file, "--exit-interval", "2"))
    before = sorted(p.name for p in save.rglob("*"))
    log = tmp_path / "engine.log"
    argv = [sys.executable, "-m", "hpcllm.training.engines.torch_engine"] + engine_argv(
        save, data_prefixes, vocab_file
    )
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        # The module's first statements install the handler; torch's import takes far
        # longer than this poll, but a signal before it would kill the process: wait
        # for the interpreter to have the handler (its signal mask shows it).
        deadline = time.time() + hang_guard(1)  # the handler: ~1 s quiet
        while not _catches_sigterm(proc.pid):
            assert proc.poll() is None and time.time() < deadline, log.read_text()
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=hang_guard(10)) == 0, log.read_text()[-3000:]  # ~10 s quiet
    text = log.read_text()
    assert "exiting at iteration 2 (signal) before 12" in text, text[-2000:]
    assert "iteration        3/" not in text
    assert sorted(p.name for p in save.rglob("*")) == before  # nothing written
    assert checkpoints.latest_iteration(save) == 2


def test_sigterm_ends_the_engine_without_the_signal_handler(tmp_path, data_prefixes, vocab_file):
    """Without --exit-signal-handler SIGTERM ends the engine at once (as it ends Megatron's),
    also after the start-up, whose handlers only remember signals."""
    log = tmp_path / "engine.log"
    argv = engine_argv(tmp_path / "ckpt", data_prefixes, vocab_file, "--train-iters", str(LONG))
    argv.remove("--exit-signal-handler")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hpcllm.training.engines.torch_engine", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + hang_guard(10)  # iteration 3: ~10 s quiet
        while "iteration        3/" not in log.read_text():
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=hang_guard(1)) == -signal.SIGTERM, log.read_text()[-2000:]
    assert f"iteration {LONG:8d}/" not in log.read_text()


def _catches_sigterm(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(x for x in status.splitlines() if x.startswith("SigCgt:")).split()[1], 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


MEGATRON_LINE = re.compile(
    r"^ \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] iteration +(\d+)/ +(\d+) \|"
    r" consumed samples: +(\d+) \| elapsed time per iteration \(ms\): [\d.]+ \|"
    r" throughput per GPU \(TFLOP/s/GPU\): [\d.]+ \| learning rate: \d\.\d{6}E[+-]\d\d \|"
    r" global batch size: +(\d+) \| lm loss: \d\.\d{6}E[+-]\d\d \| loss scale: 1\.0 \|"
    r" grad norm: [\d.]+ \| number of skipped iterations: +0 \| number of nan iterations: +0 \|$"
)


def test_log_lines_follow_megatron_training_log(tmp_path, data_prefixes, vocab_file, capsys):
    main(engine_argv(tmp_path / "ckpt", data_prefixes, vocab_file, "--exit-interval", "3"))
    if dist.is_initialized():
        dist.destroy_process_group()
    out = capsys.readouterr().out.splitlines()
    lines = [x for x in out if "iteration" in x and "|" in x]
    assert len(lines) == 3
    for n, line in enumerate(lines, 1):
        m = MEGATRON_LINE.match(line)
        assert m, line
        assert (int(m[1]), int(m[2]), int(m[3]), int(m[4])) == (n, ITERS, 4 * n, 4)


def test_partial_checkpoint_is_refused(tmp_path, data_prefixes, vocab_file):
    save = tmp_path / "ckpt"
    run_in_process(engine_argv(save, data_prefixes, vocab_file, "--exit-interval", "2"))
    os.remove(checkpoints.model_file(save, 2))
    with pytest.raises(CheckpointError, match="partial"):
        run_in_process(engine_argv(save, data_prefixes, vocab_file))
    (save / checkpoints.TRACKER).unlink()
    with pytest.raises(CheckpointError, match="no latest_checkpointed_iteration.txt"):
        run_in_process(engine_argv(save, data_prefixes, vocab_file))


def test_wrong_tokenizer_is_refused(tmp_path, data_prefixes):
    vocab = tmp_path / "vocab.json"
    vocab.write_text('{"a": 0, "b": 1, "<|endoftext|>": 2}')
    with pytest.raises(DataError, match="another tokenizer"):
        run_in_process(engine_argv(tmp_path / "ckpt", data_prefixes, str(vocab)))


def test_missing_data_is_refused(tmp_path, data_prefixes, vocab_file):
    missing = [str(tmp_path / "nothing_text_document"), data_prefixes[1]]
    with pytest.raises(DataError, match="nothing_text_document.*does not exist"):
        run_in_process(engine_argv(tmp_path / "ckpt", missing, vocab_file))


def test_throughput_benchmark_runs_on_the_cpu(repo):
    out = subprocess.run(
        [sys.executable, str(repo / "benchmarks/train_throughput.py"), "--cpu"],
        capture_output=True,
        text=True,
        timeout=hang_guard(30),  # ~30 s quiet
    )
    assert out.returncode == 0, out.stderr[-2000:]
    tokens = float(re.search(r"tokens/s: ([\d.]+)", out.stdout)[1])
    assert tokens > 0 and "TFLOP/s per GPU:" in out.stdout


def test_fp16_trains_with_dynamic_loss_scaling(tmp_path, data_prefixes, vocab_file, capsys):
    """The language benchmark's fp16 (EPICURE's precision) on the torch engine: fp16
    autocast, the loss scaled up and steps with inf/nan gradients skipped, as Megatron's
    --fp16 without --loss-scale does; the log shows the scale."""
    argv = engine_argv(
        tmp_path / "ckpt", data_prefixes, vocab_file, "--fp16", "--exit-interval", "4"
    )
    summary = run_in_process(argv)
    assert summary["last_iteration"] == 4 and 0 < summary["loss"] < 20
    lines = [x for x in capsys.readouterr().out.splitlines() if "loss scale:" in x]
    scales = [float(re.search(r"loss scale: ([\d.]+) \|", x)[1]) for x in lines]
    assert len(scales) == 4 and all(s > 1.0 for s in scales), lines  # 65536 and down
    with pytest.raises(SystemExit, match="exclude each other"):
        run_in_process(engine_argv(tmp_path / "c2", data_prefixes, vocab_file, "--fp16", "--bf16"))


def test_a_cpus_small_throughput_keeps_its_digits_in_the_log_line():
    """The results page reads TFLOP/s from the log: on a laptop (0.004 TFLOP/s) Megatron's
    one decimal wrote 0.0, which the page showed as "< 0.05"."""
    from types import SimpleNamespace

    from hpcllm.bench.logparse import parse_iteration_line
    from hpcllm.training.engines.torch_engine import log_line

    args = SimpleNamespace(train_iters=10, global_batch_size=8)
    line = log_line(3, args, 24, 120.0, 0.004123, 1e-3, 5.0, 1.0, throughput=True)
    assert "throughput per GPU (TFLOP/s/GPU): 0.004123 |" in line
    assert parse_iteration_line(line).tflops_per_gpu == 0.004123
    big = log_line(3, args, 24, 120.0, 152.25, 1e-3, 5.0, 1.0, throughput=True)
    assert "throughput per GPU (TFLOP/s/GPU): 152.2 |" in big  # Megatron's own format
