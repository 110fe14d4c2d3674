"""Megatron-LM's own resiliency features: what the site probe finds in an image (its
inside check, run as the probe runs it), what the plan says of them, and the segment's
command line where the image can run the straggler detector."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

from hpcllm.clusters import load_cluster
from hpcllm.models import megatron_resiliency as mr
from hpcllm.models.megatron_args import pretrain_gpt_args
from hpcllm.models.planner import Layout
from hpcllm.models.presets import resolve_experiment
from hpcllm.preflight.probe import check_resiliency
from hpcllm.training.campaign.chain_site import probe_record_path
from hpcllm.training.campaign.segment import straggler_log_on

CLUSTERS = REPO / "config" / "clusters"
MEGATRON_LM_DIR = os.environ.get("MEGATRON_LM_DIR")  # the pin's tree (tests/conftest.py)


def inside(sys_path: Path) -> dict:
    """The probe's inside check with ``sys_path`` first, as the probe runs it."""
    out = subprocess.run(
        [sys.executable, "-m", "hpcllm.preflight.inside", "--sys-path", str(sys_path), "json"],
        capture_output=True, text=True, check=True, cwd=sys_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    return json.loads(out.stdout.splitlines()[-1])


def write_files(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


NVRX = {
    "nvidia_resiliency_ext/__init__.py": "raise RuntimeError('the probe must not import NVRx')\n",
    "nvidia_resiliency_ext/inprocess/__init__.py": "",
    "nvidia_resiliency_ext-0.7.0.dist-info/METADATA": (
        "Metadata-Version: 2.1\nName: nvidia-resiliency-ext\nVersion: 0.7.0\n"
    ),
    "pynvml.py": "raise RuntimeError('the probe must not import pynvml')\n",
}


@pytest.mark.skipif(not MEGATRON_LM_DIR, reason="needs the pin's Megatron-LM tree")
def test_the_probe_finds_nvrx_the_gpu_sensors_and_the_pins_options(tmp_path):
    """An image with nvidia-resiliency-ext 0.7.0 (its in-process package), pynvml and the
    pin's Megatron-LM: everything found, nothing of it imported."""
    image = write_files(tmp_path / "image", NVRX)
    found = inside(image)["resiliency"]
    assert found["nvidia_resiliency_ext"] == "0.7.0" and found["nvrx_inprocess"] is True
    assert found["gpu_sensors"] == "pynvml"
    # the megatron found here is the wheel's or the tree's: the pin, both options
    assert found["megatron"] == {"inprocess_restart": True, "log_straggler": True}
    # ... read from the pin's own files, where the probe looks for them
    for path, text in mr_markers():
        assert text in (Path(MEGATRON_LM_DIR) / "megatron" / path).read_text(), path
    image_found = mr.ImageResiliency.from_inside({"resiliency": found})
    assert image_found.straggler_log and image_found.inprocess_restart
    said = check_resiliency({"resiliency": found})
    assert said["ok"] and said["check"] == "resiliency"
    assert said["detail"].startswith("nvidia-resiliency-ext 0.7.0; ")
    assert (
        "straggler detector (--log-straggler): available (GPU sensors through pynvml)"
        in said["detail"]
    )
    assert (
        "in-process restart (--inprocess-restart): available (nvidia-resiliency-ext 0.7.0), not enabled: "
        in said["detail"]
    )


def mr_markers():
    from hpcllm.preflight.inside import MEGATRON_FEATURES

    return MEGATRON_FEATURES.values()


def test_an_image_without_them_and_an_older_megatron(tmp_path):
    """A Megatron-LM without the options (a regular package shadows the installed one)
    and no NVRx, no sensor binding: the probe says so; it is an answer, not a failure."""
    image = write_files(
        tmp_path / "image",
        {"megatron/__init__.py": "", "megatron/training/arguments.py": "# no such options\n"},
    )
    found = inside(image)["resiliency"]
    assert found["nvidia_resiliency_ext"] is None and found["nvrx_inprocess"] is False
    assert found["megatron"] == {"inprocess_restart": False, "log_straggler": False}
    said = check_resiliency({"resiliency": {**found, "gpu_sensors": None}})
    assert said["ok"]
    assert said["detail"] == (
        "no nvidia-resiliency-ext; Megatron's straggler detector (--log-straggler): the "
        "image's Megatron-LM has no --log-straggler; Megatron's in-process restart "
        "(--inprocess-restart): not in the image's Megatron-LM"
    )
    # the pin's options without NVRx or pynvml: neither runs, and the plan says why
    pin = mr.ImageResiliency(megatron={"inprocess_restart": True, "log_straggler": True})
    assert not pin.straggler_log and not pin.inprocess_restart
    assert pin.inprocess_text() == "not in the image (nvidia-resiliency-ext missing)"
    assert "no GPU sensor binding (pynvml from nvidia-ml-py, or amdsmi)" in pin.straggler_text()


PIN_WITH_ALL = {
    "nvidia_resiliency_ext": "0.7.0",
    "nvrx_inprocess": True,
    "gpu_sensors": "pynvml",
    "megatron": {"inprocess_restart": True, "log_straggler": True},
}
PIN_WITHOUT_NVRX = {**PIN_WITH_ALL, "nvidia_resiliency_ext": None, "nvrx_inprocess": False}


def test_the_plan_says_what_the_segments_use(tmp_path):
    found = mr.ImageResiliency.from_inside({"resiliency": PIN_WITHOUT_NVRX})
    lines = mr.plan_lines({"a": "auto", "b": "off"}, found, "the site probe, job 7", True)
    assert lines == [
        "Megatron's straggler detector (--log-straggler): used, available (GPU sensors "
        "through pynvml) (the site probe, job 7); off for b (resiliency: off)",
        "Megatron's in-process restart (--inprocess-restart): not in the image "
        "(nvidia-resiliency-ext missing); the watchdog covers every engine",
    ]
    # before the probe ran: it decides; without a probe: not used
    before = mr.plan_lines({"a": "auto"}, None, "no site probe record (x.json)", True)
    assert "where the site probe, run before the first segment, finds it able to run" in before[0]
    assert "not enabled either way: it restarts training in the same processes" in before[1]
    unprobed = mr.plan_lines({"a": "auto"}, None, "no site probe record (x.json)", False)
    assert unprobed[0].endswith(
        "not used: no site probe record (x.json), so nothing says the image can run it"
    )
    # a record from before the question: the probe does not run again for it
    _, source = mr.from_record(write_record(tmp_path, {"torch": "2.6"}))
    old = mr.plan_lines({"a": "auto"}, None, source, True)
    assert old[0].startswith(
        "Megatron's straggler detector (--log-straggler): not used: the site probe's record"
    )
    assert "predates the question" in old[0] and "not known (the site probe's record" in old[1]
    assert mr.plan_lines({}, found, "", True) == []  # no megatron experiment: nothing


def write_record(folder: Path, inside: dict) -> Path:
    path = folder / "probe.json"
    path.write_text(json.dumps({"job_id": "3", "date": "2026-11-28", "inside": inside}))
    return path


def megatron_experiment(**extra) -> dict:
    exp = resolve_experiment(
        "opengptx_800m",
        {"preset": "opengptx_800m", "engine": "megatron", "segments": 3,
         "iterations_per_segment": 1000, "seed": 1, "log_interval": 10,
         "data": {"split": "949,50,1"}, **extra},
    )  # fmt: skip
    exp.setdefault("save_interval", 1000)
    return exp


@pytest.mark.parametrize(("gpus", "count"), [(2, 1), (4, 2), (16, 8), (1024, 64)])
def test_the_straggler_flags_on_the_command_line(gpus, count):
    exp = megatron_experiment()
    layout = Layout(gpus, 1, 1, gpus, 1, gpus * 2)
    kwargs = dict(data_path=["d"], split="949,50,1", save="s", tensorboard_dir=None,
                  data_cache_path=None, train_iters=3000, stop_iteration=1000, exit_minutes=None,
                  tokenizer_model="tok")  # fmt: skip
    argv = pretrain_gpt_args(exp, layout, straggler_log=True, **kwargs)
    at = argv.index("--straggler-minmax-count")
    assert "--log-straggler" in argv and argv[at + 1] == str(count)
    flags = set((REPO / "tests/data/megatron_flags.txt").read_text().split())
    assert {"--log-straggler", "--straggler-minmax-count"} <= flags
    assert "--log-straggler" not in pretrain_gpt_args(exp, layout, **kwargs)


def test_the_segment_runs_the_detector_where_the_probe_found_it(tmp_path, monkeypatch, caplog):
    """A megatron segment reads the probe's record of its image at its start: on with
    resiliency auto and an image that can run it; off without a record, with an image
    that cannot, with resiliency off (or YAML's false), and for the torch engine."""
    cluster = load_cluster(
        "juwels", root=CLUSTERS, environ={"HPCLLM_SCRATCH": "/s", "HPCLLM_ACCOUNT": "a"}
    )
    image = "containers/megatron-nvidia.sif"
    monkeypatch.chdir(tmp_path)
    exp = megatron_experiment()
    caplog.set_level("INFO")
    assert not straggler_log_on(exp, cluster, image)  # no record: nothing says it can
    assert "no site probe record" in caplog.text
    record = Path(probe_record_path(cluster, image))
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"job_id": "5", "inside": {"resiliency": PIN_WITHOUT_NVRX}}))
    assert straggler_log_on(exp, cluster, image)
    for off in ("off", False):
        assert not straggler_log_on({**exp, "resiliency": off}, cluster, image)
    assert not straggler_log_on({**exp, "engine": "torch"}, cluster, image)
    record.write_text(json.dumps({"inside": {"resiliency": {**PIN_WITH_ALL, "gpu_sensors": None}}}))
    assert not straggler_log_on(exp, cluster, image)
    record.write_text(json.dumps({"inside": {"torch": "2.6"}}))  # a probe before the question
    assert not straggler_log_on(exp, cluster, image)
    assert "predates the question" in caplog.text


def test_the_job_nodes_are_slurms_expanded_node_list(tmp_path, monkeypatch):
    """The nodes a Megatron rank is mapped onto: scontrol's expansion of the job's node
    list; outside a Slurm job, this host."""
    import socket

    from hpcllm.training.campaign.segment import job_nodes

    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    assert job_nodes() == [socket.gethostname()]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(
        '#!/bin/sh\n[ "$1 $2 $3" = "show hostnames jwb[0007,0012]" ] && printf "jwb0007\\njwb0012\\n"\n'
    )
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "jwb[0007,0012]")
    assert job_nodes() == ["jwb0007", "jwb0012"]
