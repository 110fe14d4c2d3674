"""The benchmark runner: how a run ends becomes its record (time limit, failure class)."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

from hpcllm.bench import runner
from hpcllm.launch import Launch


def launch(script: str) -> Launch:
    return Launch(argv=["bash", "-c", script], env={})


def processes_named(tag: str) -> list[int]:
    """Processes whose command line contains ``tag`` (the run's own, tagged by the test)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rsplit(") ", 1)[-1][:1]
        except OSError:
            continue
        if tag.encode() in cmdline and state != "Z":
            found.append(int(proc.name))
    return found


def run(tmp_path: Path, script: str, **kw) -> tuple[dict, str]:
    record = runner.run_launch(
        launch(script), {"id": "p"}, tmp_path / "run.log", tmp_path / "run.json", **kw
    )
    assert json.loads((tmp_path / "run.json").read_text()) == record
    return record, (tmp_path / "run.log").read_text()


def test_a_run_past_its_time_limit_is_stopped_with_everything_it_started(tmp_path):
    """The limit stops the whole process group: a child the launch script started in the
    background (as srun starts tasks) does not outlive the run. The work is 10 minutes,
    the limit 2 s: whenever the stop lands, nothing of the run may be left."""
    tag = f"hpcllm-test-{uuid.uuid4().hex}"
    script = f"(exec -a {tag} sleep 600) & echo started; wait"
    record, log = run(tmp_path, script, time_limit_s=2)
    assert record["status"] == "time_limit"
    assert "stopped after the run's time limit of 2 s" in log
    assert processes_named(tag) == []


def test_a_member_that_stops_slowly_is_waited_for_before_the_run_ends(tmp_path):
    """The script ends at once on SIGTERM, a member of its group 2 s later (as torchrun
    forwards the signal to workers that save): the run ends only when that member has.
    Waiting for the script alone left it running (under load, even a plain sleep)."""
    tag = f"hpcllm-test-{uuid.uuid4().hex}"
    member = (
        "import signal, sys, time; "
        "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(2), sys.exit(0))); "
        "print('ready', flush=True); time.sleep(600)"
    )
    script = f'(exec -a {tag} {sys.executable} -c "{member}") & wait'
    record, log = run(tmp_path, script, time_limit_s=3)
    assert record["status"] == "time_limit"
    assert "ready" in log  # the handler was in place when the stop came
    assert processes_named(tag) == []


def test_a_run_that_ignores_sigterm_is_killed_after_the_grace_time(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "TERM_GRACE_S", 1.0)
    tag = f"hpcllm-test-{uuid.uuid4().hex}"
    script = f"trap '' TERM; (exec -a {tag} sleep 600) & wait; wait"
    record, _ = run(tmp_path, script, time_limit_s=2)
    assert record["status"] == "time_limit" and record["returncode"] == -9
    assert processes_named(tag) == []


@pytest.mark.parametrize(
    ("script", "status"),
    [
        ("echo 'iteration 1/ 2 |'; exit 0", "ok"),
        # An exit code of 0 wins over text that looks like a failure.
        ("echo 'warning: retrying after CUDA out of memory'; exit 0", "ok"),
        (
            "echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB'; exit 1",
            "out_of_memory",
        ),
        ("echo 'srun: error: n2: task 1: Exited with exit code 1'; exit 1", "error"),
        ("echo 'ncclInternalError: Internal check failed'; exit 1", "nccl_error"),
        ("exit 3", "error"),
    ],
)
def test_a_failed_run_is_classified_from_its_log(tmp_path, script, status):
    record, _ = run(tmp_path, script)
    assert record["status"] == status
    assert record["returncode"] == int(script.rsplit(" ", 1)[-1])
    assert record["command"] == ["bash", "-c", script]
