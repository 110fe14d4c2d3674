"""Slurm's signal before a segment job's limit must leave the engines their whole save.

torchrun handles SIGTERM by killing its workers 30 s later (TORCH_ELASTIC_SHUTDOWN_TIMEOUT,
which an older torch, as in NVIDIA's image, ignores): less than a large model's save. So
the segment job asks for ``--signal=USR2@<lead>``, the launch starts torchrun with SIGUSR2
ignored, and the engines save and exit on SIGUSR2 (Megatron-LM's ``--exit-signal``); the
lead covers the save measured so far (hpcllm.training.campaign.signal_lead). Shown here
with the real torchrun and a worker whose save outlasts 30 s; through real sbatch in
tests/slurm/test_rehearsal.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from support import REPO, hang_guard

from hpcllm.clusters import load_cluster
from hpcllm.launch import build_launch
from hpcllm.training.campaign import signal_lead
from hpcllm.training.campaign.engine_process import descendants, segment_launch, shutdown_timeout
from hpcllm.training.campaign.segment import time_lead
from hpcllm.training.engines.log_lines import save_timer_line

SAVE_SECONDS = 33  # longer than torchrun's 30 s shutdown timeout

WORKER = f"""
import os, signal, sys, time
from pathlib import Path

def save(*_):
    time.sleep({SAVE_SECONDS})  # a large model's checkpoint, written on the exit signal
    Path("saved").write_text("complete")
    sys.exit(0)

signal.signal(signal.{{signal}}, save)
Path("ready").write_text(str(os.getpid()))
while True:
    time.sleep(0.1)
"""


def experiment(signal_seconds: int, engine: str = "megatron") -> dict:
    return {
        "engine": engine,
        "layout": {"nodes": 2, "procs_per_node": 4},
        "time": {"margin_seconds": 900, "signal_seconds": signal_seconds},
    }


def juwels():
    return load_cluster("juwels", REPO / "config/clusters", environ={"HPCLLM_ACCOUNT": "p"})


def test_the_launch_starts_torchrun_with_the_exit_signal_ignored():
    """In the container, directly before the launcher; the bare command has no launcher."""
    launch = segment_launch(experiment(600), ["python", "pretrain_gpt.py"], juwels(), "c.sif")
    words = launch.argv
    at = words.index("torchrun_jsc")
    assert words[at - 3 : at] == ["bash", "-c", 'trap "" USR2; exec "$0" "$@"']
    assert words.index("c.sif") < at - 3  # inside the container, after its env -u
    assert """c.sif env -u PMIX_SECURITY_MODE bash -c 'trap "" USR2; exec "$0" "$@"' """ \
        "torchrun_jsc --nnodes 2" in launch.shell()  # fmt: skip
    # a SIGTERM (scancel, preemption) still gets the lead where torchrun honours it
    assert launch.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "600"
    assert shutdown_timeout(experiment(10)) == 30  # never below torchrun's own
    local = load_cluster("local", REPO / "config/clusters")
    one = segment_launch({**experiment(60, "torch"), "layout": {}}, ["python", "e.py"], local, None)
    assert one.argv == ["python", "e.py"]  # the engine itself gets the signal
    with pytest.raises(ValueError, match="not a signal name"):
        build_launch(local, nodes=1, procs_per_node=2, command=["x"], launcher_ignores="USR2;x")


def test_megatron_saves_on_the_exit_signal():
    from hpcllm.models.megatron_args import FLAGS, MEGATRON_LM_COMMIT

    flags = (REPO / "tests/data/megatron_flags.txt").read_text().split()
    assert FLAGS[MEGATRON_LM_COMMIT]["exit_signal"] in flags  # the pin's parser has it
    assert signal_lead.EXIT_SIGNAL is signal.Signals["SIGUSR2"]  # its type, at the pin


def test_the_lead_covers_the_measured_save(tmp_path):
    log = (
        " [2026-11-26 10:00:00] iteration       10/     100 | elapsed time per iteration (ms):"
        " 4000.0 | lm loss: 1.0E+00 |\n"
        "INFO:megatron.core.timers:(min, max) time across ranks (ms):\n"
        "    save-checkpoint ................................: (118000.00, 121500.00)\n"
        + save_timer_line(90_000.0)  # the torch engine's, as Megatron's
    )
    assert signal_lead.save_seconds(log) == 121.5
    assert signal_lead.save_seconds("save-checkpoint-non-persistent ...: (1.00, 2.00)") is None
    folder = tmp_path / "iter_0000010"
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"x" * 1000)
    measured = signal_lead.measure(log, folder)
    assert measured == {"save_seconds": 121.5, "checkpoint_bytes": 1000, "iteration_seconds": 4.0}

    save = tmp_path / "checkpoints"
    exp = experiment(200)
    assert signal_lead.measured(save) is None  # nothing yet: the configured lead stands
    assert signal_lead.slurm_signal(exp, save) == "--signal=USR2@200"
    assert "no checkpoint save measured yet" in signal_lead.lead_note(exp, None, "x")
    (save / "chain").mkdir(parents=True)
    for k, seconds in ((1, 20.0), (2, 121.5)):
        record = {"segment": k, "save_seconds": seconds, "iteration_seconds": 4.0}
        (save / "chain" / f"seg{k}.json").write_text(json.dumps(record))
    (save / "chain" / "seg3.json").write_text(json.dumps({"segment": 3}))  # none measured
    found = signal_lead.measured(save)
    assert found["segment"] == 2
    assert signal_lead.lead_seconds(exp, found) == 247  # 2 x 121.5 + 4
    assert signal_lead.lead_seconds(experiment(600), found) == 600  # configured is enough
    note = signal_lead.lead_note(exp, found, "x")
    assert note.startswith("Warning: x: time.signal_seconds (200 s) is below")
    assert "a save took 122 s in segment 2" in note and "247 s" in note
    assert not signal_lead.lead_note(experiment(600), found, "x").startswith("Warning")
    sbatch = ["--nodes=2", "--ntasks-per-node=1", "--signal=USR2@200"]
    assert signal_lead.with_lead(sbatch, exp, save)[-1] == "--signal=USR2@247"
    assert signal_lead.with_lead(["--nodes=2"], exp, save) == ["--nodes=2"]
    # the segment's own view of when it stops for time follows the lead
    exp["time"]["margin_seconds"] = 60
    assert time_lead(exp, str(save)) == 247 + 30 and time_lead(exp) == 230


def test_descendants_are_found_through_new_sessions():
    child = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         "subprocess.Popen(['sleep', '30'], start_new_session=True); time.sleep(30)"],
    )  # fmt: skip
    try:
        deadline = time.time() + hang_guard(10)
        while len(descendants(child.pid)) < 1:
            assert time.time() < deadline
            time.sleep(0.05)
        grandchild = descendants(child.pid)[0]
        assert open(f"/proc/{grandchild}/cmdline").read().startswith("sleep")
    finally:
        for pid in descendants(child.pid):
            os.kill(pid, signal.SIGKILL)
        child.kill()
        child.wait()


def test_torchrun_under_the_wrapper_waits_for_a_save_longer_than_30_s(tmp_path):
    """The same worker under the real torchrun, side by side, without
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT, both signalled as Slurm's --signal signals a step (every
    process: torchrun and its worker). SIGUSR2 under the launch's wrapper: the save
    completes and torchrun exits 0. SIGTERM: torchrun kills the worker at 30 s."""
    local = load_cluster("local", REPO / "config/clusters")
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"}
    bin_dir = str((REPO / ".venv/bin").resolve())
    environ["PATH"] = f"{bin_dir}{os.pathsep}{environ['PATH']}"
    runs = {}
    for case, sig, ignores in (("usr2", "SIGUSR2", "USR2"), ("term", "SIGTERM", None)):
        folder = tmp_path / case
        folder.mkdir()
        (folder / "w.py").write_text(WORKER.replace("{signal}", sig))
        launch = build_launch(
            local, nodes=1, procs_per_node=1, command=[sys.executable, "w.py"],
            rendezvous=True, launcher_ignores=ignores,
        )  # fmt: skip
        (folder / "launch.sh").write_text(launch.shell())
        runs[case] = folder, getattr(signal, sig), subprocess.Popen(
            ["bash", "launch.sh"], cwd=folder, env={**environ, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    assert "trap" in (tmp_path / "usr2/launch.sh").read_text()
    deadline = time.time() + hang_guard(30)
    for folder, _, proc in runs.values():
        while not (folder / "ready").exists() or not (folder / "ready").read_text():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
            time.sleep(0.1)
    for folder, signum, proc in runs.values():
        for pid in (proc.pid, int((folder / "ready").read_text())):  # torchrun, the worker
            os.kill(pid, signum)
    outputs = {
        case: proc.communicate(timeout=hang_guard(60))[0] for case, (_, _, proc) in runs.items()
    }
    folder, _, proc = runs["usr2"]
    assert (folder / "saved").exists() and proc.returncode == 0, outputs["usr2"][-3000:]
    folder, _, proc = runs["term"]
    assert not (folder / "saved").exists(), outputs["term"][-3000:]
    assert "forcefully exiting" in outputs["term"], outputs["term"][-3000:]  # SIGKILL at 30 s
