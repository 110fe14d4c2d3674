"""Issue 32 item 8: on Slurm's SIGTERM before the limit, torchrun forwards it to the
workers and SIGKILLs them after its shutdown timeout, 30 s by default: a save longer than
that was cut off. The segment's launch gives the workers the signal's whole lead
(time.signal_seconds) through TORCH_ELASTIC_SHUTDOWN_TIMEOUT; shown with the real torchrun
and a worker whose save on SIGTERM outlasts the default."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from support import REPO, hang_guard

from hpcllm.clusters import load_cluster
from hpcllm.training.campaign.engine_process import segment_launch, shutdown_timeout

SAVE_SECONDS = 33  # longer than torchrun's default 30 s

WORKER = f"""
import signal, sys, time
from pathlib import Path

def save(*_):
    time.sleep({SAVE_SECONDS})  # a large model's checkpoint, written on SIGTERM
    Path("saved").write_text("complete")
    sys.exit(0)

signal.signal(signal.SIGTERM, save)
Path("ready").write_text("")
while True:
    time.sleep(0.1)
"""


def experiment(signal_seconds: int) -> dict:
    return {
        "engine": "megatron",
        "layout": {"nodes": 2, "procs_per_node": 4},
        "time": {"margin_seconds": 900, "signal_seconds": signal_seconds},
    }


def juwels():
    return load_cluster("juwels", REPO / "config/clusters", environ={"HPCLLM_ACCOUNT": "p"})


def test_the_launch_gives_the_workers_the_signals_lead():
    launch = segment_launch(experiment(600), ["python", "pretrain_gpt.py"], juwels(), None)
    assert launch.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "600"
    assert "export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=600" in launch.shell()
    assert shutdown_timeout(experiment(10)) == 30  # never below torchrun's own
    assert shutdown_timeout({"engine": "torch"}) == 30


def test_torchrun_waits_the_leads_seconds_for_a_save_after_sigterm(tmp_path):
    """The same worker under torchrun twice, side by side: with the launch's variable its
    save longer than 30 s completes; with torchrun's default it is killed in the middle."""
    launch = segment_launch(experiment(120), ["python", "w.py"], juwels(), None)
    timeout = launch.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"}
    runs = {}
    for case, env in (("lead", {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": timeout}), ("default", {})):
        folder = tmp_path / case
        folder.mkdir()
        (folder / "w.py").write_text(WORKER)
        runs[case] = folder, subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc-per-node", "1", "w.py"],
            cwd=folder, env={**environ, **env, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    deadline = time.time() + hang_guard(20)
    for folder, proc in runs.values():
        while not (folder / "ready").exists():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
            time.sleep(0.1)
    for _, proc in runs.values():
        proc.send_signal(signal.SIGTERM)  # as Slurm's --signal reaches the job step
    outputs = {
        case: proc.communicate(timeout=hang_guard(60))[0] for case, (_, proc) in runs.items()
    }
    outcomes = {
        case: ((folder / "saved").exists(), outputs[case]) for case, (folder, _) in runs.items()
    }
    saved, output = outcomes["lead"]
    assert saved, output[-3000:]
    saved, output = outcomes["default"]
    assert not saved and "forcefully exiting" in output, output[-3000:]  # SIGKILL at 30 s
