"""The cluster rehearsal: the GPU jobs of a cluster profile, through real sbatch.

profiles/rehearsal (the shape of profiles/juwels: whole nodes, ``--gres=gpu:N``, one task
per node, cpus per task, ``--signal``) on the test cluster, whose nodes advertise GPUs.
One run makes a Megatron-engine training segment, a language benchmark point and a
vision benchmark point (tests/slurm/rehearsal.yaml, 2 nodes each), then the summary,
plots and report from their logs. The rules, job geometry, launch scripts, environment
and container command lines are the workflow's own; stand-ins only for what cannot exist
here (docs/slurm-tests.md): ``apptainer`` (tests/slurm/standins/apptainer, running the
command in an image environment without hpcllm, rehearsal_image.py) and Megatron-LM's
``pretrain_gpt.py`` (tests/slurm/standins/pretrain_gpt.py). The vision trainer is real.
"""

from __future__ import annotations

import json
import os
import string
import subprocess
from pathlib import Path

import pytest
import rehearsal_image
import slurmruns
from support import hang_guard

from hpcllm.clusters import load_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.rehearsal]

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "rehearsal.yaml"
STANDINS = HERE / "standins"
SRC = str(slurmruns.REPO / "src")
EXPERIMENT = "rehearsal_megatron"
LANGUAGE = "rehearsal_language.tiny.strong.bf16.n0002"
VISION = "rehearsal_vision.resnet_tiny.weak.fp32.n0002"
TARGETS = (
    f"results/train/{EXPERIMENT}/seg1.json",
    "results/bench/summary.csv",
    "results/bench/plots/efficiency.png",
    "results/bench/plots/throughput.png",
    "results/bench/plots/batch_time_cdf.png",
    "results/bench/plots/loss.png",
)
GPU_RULES = ("train_segment", "bench_language", "bench_vision")
CPUS_PER_TASK = "8"  # profiles/rehearsal


@pytest.fixture(scope="module")
def image() -> Path:
    """The image's Python environment (built once per envs/requirements.txt, cached)."""
    env = rehearsal_image.python_env()
    no_hpcllm = subprocess.run(
        [str(env / "bin" / "python"), "-c", "import hpcllm"], capture_output=True, cwd="/"
    )
    assert no_hpcllm.returncode != 0, "the rehearsal image must not have hpcllm"
    return env


def snakemake(work: Path, cluster, env: dict[str, str], *args: str, timeout: float):
    cmd = slurmruns.command(work, "rehearsal", "--configfile", str(CONFIG), *args)
    proc = subprocess.run(
        cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed ({proc.returncode})\n--- stdout\n{proc.stdout[-6000:]}\n"
        f"--- stderr\n{proc.stderr[-12000:]}\n--- cluster\n{cluster.log_tail()}"
    )
    return proc


@pytest.fixture(scope="module")
def rehearsal(slurm_cluster, image, tmp_path_factory):
    """The run: data made locally, then the GPU jobs on the test cluster, then the report."""
    slurm_cluster.restore()
    work = slurmruns.make_workdir(tmp_path_factory.mktemp("rehearsal") / "work")
    # The text and image data, as the earlier stages of a campaign would have left them
    # (the built-in config: the rehearsal's experiments are for the rehearsal cluster).
    slurmruns.run(work, None, "--until", "merge_tokenized", "pack_lmdb", profile="local")
    env = slurmruns.environment(slurm_cluster)
    env.update(
        PATH=f"{STANDINS}{os.pathsep}{env['PATH']}",  # the stand-in apptainer
        HPCLLM_REHEARSAL_IMAGE=str(image),
        HPCLLM_REHEARSAL_RECORD=str(work / "apptainer.jsonl"),
        SCRATCH=str(work / "scratch"),  # as `jutil env activate` sets it on JUWELS
    )
    # quiet: the run ~80 s, the report ~10 s (timeouts are hang guards, tests/support.py)
    proc = snakemake(work, slurm_cluster, env, "--", *TARGETS, timeout=hang_guard(80))
    snakemake(
        work, slurm_cluster, env, "--report", "report.html", "--", *TARGETS, timeout=hang_guard(10)
    )
    execs = [json.loads(line) for line in (work / "apptainer.jsonl").read_text().splitlines()]
    return work, proc.stdout + proc.stderr, execs


def jobs_of(work: Path) -> dict[str, str]:
    """Slurm job id -> rule of every job this run submitted (the plugin's logs), and with
    training.chain the chain's jobs that ran (those with a log; a successor cancelled
    while pending has none)."""
    jobs = {job: rule for rule, logs in slurmruns.slurm_logs(work).items() for job, _ in logs}
    for log in (work / "logs/train_segment").glob("*/chain/*.log"):
        jobs[log.stem] = "train_segment"
    return jobs


def test_every_gpu_job_completed_on_both_nodes(rehearsal, slurm_cluster):
    work, output, _ = rehearsal
    jobs = jobs_of(work)
    assert set(GPU_RULES) <= set(jobs.values()), output[-3000:]
    states = {j["id"]: j for j in slurm_cluster.jobs()}
    for job, rule in jobs.items():
        assert states[job]["state"] == "COMPLETED", (rule, states[job])
        if rule in GPU_RULES:
            assert states[job]["nodes"] == "n[1-2]", (rule, states[job])


def test_each_job_runs_one_step_over_all_its_nodes_in_the_image(rehearsal):
    """The launch script's srun (not a step nested in another) got both nodes: one
    container per node in the same job step, each with its GPUs; the node names are in
    the job's own log."""
    work, _, execs = rehearsal
    jobs = jobs_of(work)
    logs = {
        "train_segment": work / f"logs/train_segment/{EXPERIMENT}/seg1.engine.log",
        "bench_language": work / f"results/bench/language/{LANGUAGE}/run.log",
        "bench_vision": work / f"results/bench/vision/{VISION}/run.log",
    }
    for rule in GPU_RULES:
        ids = [job for job, r in jobs.items() if r == rule]
        mine = [e for e in execs if e["job"] in ids]
        assert sorted(e["node"] for e in mine) == ["n1", "n2"], (rule, mine)
        assert len({e["step"] for e in mine}) == 1 and mine[0]["step"] != "batch", mine
        for e in mine:
            assert e["env"]["SLURM_STEP_NUM_NODES"] == "2", (rule, e["env"])
            assert e["env"]["CUDA_VISIBLE_DEVICES"] == "0,1", (rule, e["env"])
        text = logs[rule].read_text()
        for node in ("n1", "n2"):
            assert f"apptainer stand-in: exec on node {node}" in text, (rule, text[-3000:])
    engine_log = logs["train_segment"].read_text()
    assert all(f"of 4 on node {n}" in engine_log for n in ("n1", "n2")), engine_log[-3000:]


def expand(value: str, scratch: Path) -> str:
    """A facts file's value as the job expands it."""
    values = {"SCRATCH": str(scratch), "SLURM_CPUS_PER_TASK": CPUS_PER_TASK}
    return string.Template(value).substitute(values)


def expected_env(cluster, scratch: Path) -> dict[str, str]:
    return {k: expand(v, scratch) for k, v in cluster.env.items()}


def test_binds_and_environment_are_the_facts_files(rehearsal, image):
    work, _, execs = rehearsal
    cluster = load_cluster("rehearsal", slurmruns.REPO / "config" / "clusters")
    jobs = jobs_of(work)
    expected = expected_env(cluster, work / "scratch")
    assert execs
    for e in execs:
        rule = jobs[e["job"]]
        assert e["gpu_flags"] == ["--nv"], e  # gpu.vendor: nvidia
        # The benchmark points run `python -m hpcllm...` in the image: the checkout's src/.
        extra = [SRC] if rule.startswith("bench_") else []
        binds = [expand(b, work / "scratch") for b in cluster.container_binds]
        assert e["binds"] == [*binds, *extra], (rule, e["binds"])
        if rule.startswith("bench_"):
            assert e["env"]["PYTHONPATH"] == SRC
        assert e["image"].endswith(".sif")
        for name, value in expected.items():
            assert e["env"].get(name) == value, (rule, name)
        # env_outside_container: set for srun, removed for the program in the image.
        for name, value in cluster.env_outside_container.items():
            assert e["env"][name] == value
            assert e["command"][:3] == ["env", "-u", name], e["command"]
        assert e["command"][3] == cluster.launcher
        # The image's own Python runs the program, never the host's environment.
        assert e["env"]["PATH"].split(os.pathsep)[0] == str(image / "bin")
        assert str(slurmruns.REPO / ".venv") not in e["env"]["PATH"]


def test_summary_plots_and_report_come_from_the_rehearsals_logs(rehearsal):
    import pandas as pd

    from hpcllm.bench.logparse import parse_megatron_log

    work, _, _ = rehearsal
    summary = pd.read_csv(work / "results/bench/summary.csv").set_index("id")
    assert sorted(summary.index) == sorted([LANGUAGE, VISION])
    assert set(summary["status"]) == {"ok"}, summary["status"]
    assert set(summary["nodes"]) == {2} and set(summary["gpus"]) == {4}
    # The language row's throughput is the median of what its own log says.
    parsed = parse_megatron_log(work / f"results/bench/language/{LANGUAGE}/run.log")
    logged = sorted(i.tflops_per_gpu for i in parsed.iterations[2:])  # warm-up left out
    assert len(parsed.iterations) == 6
    row = summary.loc[LANGUAGE]
    assert row["tflops_per_gpu"] == pytest.approx(logged[len(logged) // 2], rel=1e-6)
    record = json.loads((work / f"results/bench/vision/{VISION}/run.json").read_text())
    assert record["status"] == "ok" and str(summary.loc[VISION]["slurm_job_id"]) in jobs_of(work)
    for plot in ("efficiency", "throughput", "batch_time_cdf", "loss"):
        assert (work / f"results/bench/plots/{plot}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (work / "report.html").read_text(errors="replace")
    assert "summary.csv" in report and "efficiency.png" in report


def test_the_segment_wrote_megatrons_checkpoint_layout(rehearsal):
    work, _, _ = rehearsal
    save = work / "checkpoints" / EXPERIMENT
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    # TP 2, PP 1: one shard per tensor-parallel rank, written at iterations 2 and 4.
    for it in ("iter_0000002", "iter_0000004"):
        assert sorted(p.name for p in (save / it).iterdir()) == ["mp_rank_00", "mp_rank_01"]
    record = json.loads((work / f"results/train/{EXPERIMENT}/seg1.json").read_text())
    assert record["engine"] == "megatron" and record["last_iteration"] == 4
    # A benchmark point measures; it saves no checkpoint.
    language = work / f"results/bench/language/{LANGUAGE}"
    assert not list(language.rglob("latest_checkpointed_iteration.txt"))
