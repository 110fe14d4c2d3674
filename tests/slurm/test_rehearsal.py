"""The cluster rehearsal: the GPU jobs of a cluster profile, through real sbatch.

profiles/rehearsal (the shape of profiles/juwels: whole nodes, ``--gres=gpu:N``, one task
per node, cpus per task, ``--signal``) on the test cluster, whose nodes advertise GPUs.
One run makes a Megatron-engine training segment, a language benchmark point and a
vision benchmark point (tests/slurm/rehearsal.yaml, 2 nodes each), after the site probes
and a canary per job type (workflow/rules/preflight.smk), then the summary, plots and
report from their logs; and a failed canary that holds its GPU jobs back. The rules, job
geometry, launch scripts, environment and container command lines are the workflow's own; stand-ins only for what cannot exist
here (docs/slurm-tests.md): ``apptainer`` (tests/slurm/standins/apptainer, running the
command in an image environment without hpcllm, rehearsal_image.py), Megatron-LM's
``pretrain_gpt.py`` (tests/slurm/standins/pretrain_gpt.py), ``nvidia-smi`` and the image's
GPU modules (tests/slurm/standins/image/). The vision trainer is real.
"""

from __future__ import annotations

import json
import os
import shutil
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
    f"results/eval/{EXPERIMENT}/scores.csv",  # its export and evaluation after it
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
    # quiet: the run ~120 s, the report ~10 s (timeouts are hang guards, tests/support.py)
    proc = snakemake(work, slurm_cluster, env, "--", *TARGETS, timeout=hang_guard(120))
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


def canary_kinds(work: Path) -> dict[str, str]:
    """Slurm job id -> kind of every canary job (the plugin's log folder is its wildcard)."""
    return {job: log.parent.name for job, log in slurmruns.slurm_logs(work).get("canary", [])}


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
    jobs, kinds = jobs_of(work), canary_kinds(work)
    expected = expected_env(cluster, work / "scratch")
    assert execs
    for e in execs:
        rule = jobs[e["job"]]
        assert e["gpu_flags"] == ["--nv"], e  # gpu.vendor: nvidia
        # The benchmark points, their canaries and the site probe run `python -m
        # hpcllm...` in the image: the checkout's src/.
        # So do the evaluation jobs, one process each without the launcher, as the probe.
        alone = rule in ("site_probe", "evaluate_tasks", "evaluate_perplexity")
        with_src = rule.startswith("bench_") or alone
        with_src |= rule == "canary" and not kinds[e["job"]].startswith("train_")
        extra = [SRC] if with_src else []
        binds = [expand(b, work / "scratch") for b in cluster.container_binds]
        assert e["binds"] == [*binds, *extra], (rule, e["binds"])
        if with_src:
            assert e["env"]["PYTHONPATH"] == SRC
        assert e["image"].endswith(".sif")
        for name, value in expected.items():
            if alone and "SLURM_" in cluster.env[name]:
                continue  # read back from the job's record only for a launch over srun
            assert e["env"].get(name) == value, (rule, name)
        # env_outside_container: set for srun, removed for the program in the image.
        for name, value in cluster.env_outside_container.items():
            assert e["env"][name] == value
            assert e["command"][:3] == ["env", "-u", name], e["command"]
        # The probe and the evaluation start the image's Python themselves; every other
        # job the launcher, the training jobs with Slurm's SIGUSR2 ignored in it (the
        # engine saves on it: hpcllm.training.campaign.signal_lead).
        training = rule == "train_segment" or kinds.get(e["job"], "").startswith("train_")
        if training:
            assert e["command"][3:6] == ["bash", "-c", 'trap "" USR2; exec "$0" "$@"'], e
        assert e["command"][6 if training else 3] == ("python" if alone else cluster.launcher)
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
        names = sorted(p.name for p in (save / it).iterdir())
        # each TP rank's weights; beside them the checksums the segment's wrapper records
        # of a committed folder (of an earlier one only if it saw it committed)
        assert [n for n in names if n != "hpcllm_checksums.json"] == ["mp_rank_00", "mp_rank_01"]
    assert (save / "iter_0000004" / "hpcllm_checksums.json").is_file()
    record = json.loads((work / f"results/train/{EXPERIMENT}/seg1.json").read_text())
    assert record["engine"] == "megatron" and record["last_iteration"] == 4
    # A benchmark point measures; it saves no checkpoint.
    language = work / f"results/bench/language/{LANGUAGE}"
    assert not list(language.rglob("latest_checkpointed_iteration.txt"))


def test_the_last_checkpoint_is_exported_and_evaluated_through_sbatch(rehearsal, slurm_cluster):
    """The campaign's end (workflow/rules/export.smk, evaluate.smk) as the profile submits
    it: the export of the segment's Megatron checkpoint (TP 2, merged) as a Slurm job, then
    the tasks and the perplexity each as a 1-node job in the training image, the table on
    the login node."""
    work, _, execs = rehearsal
    jobs = jobs_of(work)
    states = {j["id"]: j for j in slurm_cluster.jobs()}
    for rule in ("export_model", "evaluate_tasks", "evaluate_perplexity"):
        (job,) = [j for j, r in jobs.items() if r == rule]
        assert states[job]["state"] == "COMPLETED" and states[job]["nodes"] in ("n1", "n2")
    record = json.loads(
        (work / f"results/export/{EXPERIMENT}/iter_0000004/export.json").read_text()
    )
    folder = work / f"results/export/{EXPERIMENT}/iter_0000004"
    assert record["iteration"] == 4 and (folder / "config.json").is_file(), record
    assert list(folder.glob("*.safetensors")) and (folder / "tokenizer.json").is_file()
    for rule in ("evaluate_tasks", "evaluate_perplexity"):
        (job,) = [j for j, r in jobs.items() if r == rule]
        (e,) = [e for e in execs if e["job"] == job]
        assert e["command"][3:7] == ["python", "-m", "hpcllm.evaluation.run", rule], e
    scores = (work / f"results/eval/{EXPERIMENT}/scores.csv").read_text()
    assert f"{EXPERIMENT},4,module_purpose,acc," in scores, scores
    assert "validation perplexity (all)" in scores, scores


def preflight(work: Path, what: str) -> dict:
    return json.loads((work / "results/preflight/rehearsal" / f"{what}.json").read_text())


def test_the_probe_and_a_canary_per_job_type_ran_before_the_gpu_jobs(rehearsal, slurm_cluster):
    """Pre-flight (workflow/rules/preflight.smk) through real sbatch: per image a site probe
    whose answers are recorded, per GPU job type a canary of the real launch on two nodes
    (the rehearsal's jobs of every type run on both: the rendezvous and an all-reduce
    across nodes), the training canary through a checkpoint save and a resume from it;
    every GPU job started in the image after its canary ended."""
    work, output, execs = rehearsal
    jobs, kinds = jobs_of(work), canary_kinds(work)
    states = {j["id"]: j for j in slurm_cluster.jobs()}
    # the first plan is a chain already (issue 47): the probe, run before the first
    # segment, decides how its jobs are submitted; the segment ran in the chain's job
    assert (
        "training: each experiment runs as a chain of Slurm jobs by default, in Slurm "
        "without the login node. Whether compute nodes may call sbatch is not known yet: "
        "the site probe, run before the first segment, finds out" in output
    )
    assert list((work / f"logs/train_segment/{EXPERIMENT}/chain").glob("*.log")), output[-3000:]
    for image in ("megatron-nvidia", "vision-nvidia"):
        record = preflight(work, f"probe/{image}")
        assert record["ok"] and jobs[record["job_id"]] == "site_probe", record
        assert record["host"] and record["date"].startswith("20")
        checks = {c["check"]: c for c in record["checks"]}
        assert all(c["ok"] for c in checks.values()), checks
        assert "2 x NVIDIA A100-SXM4-40GB" in checks["gpus"]["detail"]
        assert checks["slurm_from_compute_node"]["detail"].endswith(
            "scontrol requeue: allowed; scancel: allowed"
        )
        # the held job asked for what train_segment asks for: its GPUs and cores
        assert checks["slurm_from_compute_node"]["detail"].startswith(
            "sbatch --partition batch --gres gpu:2 --cpus-per-task 8: job "
        ), checks["slurm_from_compute_node"]
        assert record["slurm_from_compute_node"] is True  # the chain's default here
        for name in ("container_runtime", "image_start", "local_storage", "scratch", "internet"):
            assert name in checks
    modules = {c["check"] for c in preflight(work, "probe/megatron-nvidia")["checks"]}
    assert {
        "module megatron.core.datasets.helpers_cpp",
        "module transformer_engine",
        # its fused Adam: the distributed optimizer resumes with it (megatron_args.as_run)
        "module transformer_engine.pytorch.optimizers",
    } <= modules
    assert sorted(kinds.values()) == ["language_megatron", "train_megatron", "vision"]
    first_gpu_exec = {
        rule: min(e["time"] for e in execs if jobs.get(e["job"]) == rule) for rule in GPU_RULES
    }
    of_kind = {"train_megatron": "train_segment", "language_megatron": "bench_language",
               "vision": "bench_vision"}  # fmt: skip
    for job, kind in kinds.items():
        record = preflight(work, f"canary/{kind}")
        assert record["job_id"] == job and record["nodes"] == 2, record
        assert states[job]["state"] == "COMPLETED" and states[job]["nodes"] == "n[1-2]"
        mine = [e for e in execs if e["job"] == job]
        assert {e["node"] for e in mine} == {"n1", "n2"}, mine  # ranks on both nodes
        assert {e["env"]["CUDA_VISIBLE_DEVICES"] for e in mine} == {"0,1"}, mine
        assert max(e["time"] for e in mine) < first_gpu_exec[of_kind[kind]], kind
    train = preflight(work, "canary/train_megatron")
    steps = [(s["resumed_from_iteration"], s["last_iteration"]) for s in train["segments"]]
    assert steps == [(0, 2), (2, 4)] and train["latest_checkpoint"] == 4


@pytest.fixture(scope="module")
def failed_canary(rehearsal, slurm_cluster, tmp_path_factory):
    """The rehearsal's folder without the segment and its canary, run again with an image
    whose Megatron-LM does not know an option the jobs pass (its flag list lacks it)."""
    done, _, _ = rehearsal
    work = tmp_path_factory.mktemp("failed-canary") / "work"
    shutil.copytree(done, work, symlinks=True)
    for made in (f"results/train/{EXPERIMENT}", "results/preflight/rehearsal/canary"):
        shutil.rmtree(work / made)
    flags = work / "older_megatron_flags.txt"
    known = (slurmruns.REPO / "tests/data/megatron_flags.txt").read_text().splitlines()
    flags.write_text("\n".join(f for f in known if f != "--exit-signal-handler") + "\n")
    env = slurmruns.environment(slurm_cluster)
    env.update(
        PATH=f"{STANDINS}{os.pathsep}{env['PATH']}",
        HPCLLM_REHEARSAL_IMAGE=str(rehearsal_image.python_env()),
        HPCLLM_REHEARSAL_RECORD=str(work / "apptainer.jsonl"),
        HPCLLM_REHEARSAL_MEGATRON_FLAGS=str(flags),
        SCRATCH=str(work / "scratch"),
    )
    before = jobs_of(work)
    cmd = slurmruns.command(work, "rehearsal", "--configfile", str(CONFIG), "--", TARGETS[0])
    proc = subprocess.run(
        cmd, cwd=work, env=env, capture_output=True, text=True, timeout=hang_guard(60)
    )
    new = {job: rule for job, rule in jobs_of(work).items() if job not in before}
    return work, proc, new


def test_a_failed_canary_holds_the_gpu_jobs_back(failed_canary):
    work, proc, new = failed_canary
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    # Only the canary was submitted (the probe's record stands; nothing else was planned
    # after it): no training segment, no benchmark point.
    assert sorted(new.values()) == ["canary"], (new, output[-3000:])
    # the next run's plan decides the chain from the probe's record (it ran before)
    chained = "training: each experiment runs as a chain of Slurm jobs by default, each "
    assert chained + "submitting its successor (compute nodes may call sbatch: " in output
    engine_log = "results/preflight/rehearsal/canary/train_megatron/seg1.engine.log"
    said = [line for line in output.splitlines() if "canary" in line]
    assert (
        f"canary train_megatron on rehearsal failed (config_error; see {engine_log})" in output
    ), (
        said,
        (work / engine_log).read_text()[-3000:],
    )
    assert "unrecognized arguments: --exit-signal-handler" in (work / engine_log).read_text()
    assert not (work / "results/preflight/rehearsal/canary/train_megatron.json").exists()
    assert not (work / f"results/train/{EXPERIMENT}").exists()


# ---- the fallback signal: a save longer than torchrun's 30 s, then the resume from it

SIGNAL_SAVE_SECONDS = 35  # the stand-in's save on the exit signal (torchrun kills at 30)


@pytest.fixture(scope="module")
def signalled(rehearsal, slurm_cluster, tmp_path_factory):
    """The rehearsal's folder without its training, run again (one Slurm job per attempt)
    with segment 1 far longer than its 3-minute job: Slurm's --signal (90 s before the
    limit; slurmctld sends it 60-90 s after the start) reaches the steps while the engine
    trains, well before its own --exit-duration-in-mins (2 minutes); the Megatron
    stand-in's save on it takes 35 s, and the image's torchrun ignores
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT (as NVIDIA's does: 30 s after a SIGTERM). With one
    attempt the run fails there; the second run, with the segment's target a little past
    that checkpoint, resumes from it; a dry run then states the lead from the measured
    save."""
    done, _, _ = rehearsal
    work = tmp_path_factory.mktemp("signalled") / "work"
    shutil.copytree(done, work, symlinks=True)
    for made in ("results/train", "checkpoints", "logs/train_segment"):
        shutil.rmtree(work / made / EXPERIMENT)
    env = slurmruns.environment(slurm_cluster)
    env.update(
        PATH=f"{STANDINS}{os.pathsep}{env['PATH']}",
        HPCLLM_REHEARSAL_IMAGE=str(rehearsal_image.python_env()),
        HPCLLM_REHEARSAL_RECORD=str(work / "apptainer.jsonl"),
        HPCLLM_REHEARSAL_SIGNAL_SAVE_SECONDS=str(SIGNAL_SAVE_SECONDS),
        HPCLLM_REHEARSAL_OLD_TORCHRUN="1",  # ignores TORCH_ELASTIC_SHUTDOWN_TIMEOUT: 30 s
        SCRATCH=str(work / "scratch"),
    )

    def run(iterations: int, *args: str, expected_s: float):
        config = work / f"segment_{iterations}.yaml"
        config.write_text(  # (far more passes over the samples than a real plan allows)
            f"training: {{chain: false, max_attempts: 1, experiments: {{{EXPERIMENT}: "
            f"{{iterations_per_segment: "
            f"{iterations}, save_interval: 100000, data: {{max_passes: 1.0e+9}}, "
            "time: {margin_seconds: 0, signal_seconds: 90}}}}\n"
        )
        cmd = slurmruns.command(
            work, "rehearsal", "--configfile", str(CONFIG), str(config),
            "--set-resources", "train_segment:runtime=3", *args, "--", TARGETS[0],
        )  # fmt: skip
        return subprocess.run(
            cmd, cwd=work, env=env, capture_output=True, text=True,
            timeout=hang_guard(expected_s),
        )  # fmt: skip

    first = run(100000, expected_s=150)  # the 3-minute job: signalled, saved, stopped
    attempts = work / f"logs/train_segment/{EXPERIMENT}/seg1.attempts.json"
    reached = json.loads(attempts.read_text())[0]["reached_iteration"] if attempts.exists() else 0
    engine_log = work / f"logs/train_segment/{EXPERIMENT}/seg1.engine.log"
    engine_log = engine_log.read_text() if engine_log.exists() else first.stderr[-6000:]
    segment_log = work / f"logs/train_segment/{EXPERIMENT}/seg1.log"  # (the next run's `log:`)
    segment_log = segment_log.read_text() if segment_log.exists() else ""
    second = run(reached + 2, expected_s=45) if reached else None  # resumes, 2 iterations
    planned = run(reached + 2, "-n", "-f", expected_s=15) if reached else None  # the lead
    return work, first, engine_log, segment_log, second, planned


def test_a_save_on_the_signal_outlasts_torchruns_30_s_and_the_next_run_resumes_from_it(
    signalled, slurm_cluster
):
    work, first, engine_log, segment_log, second, planned = signalled
    output = first.stdout + first.stderr
    assert first.returncode != 0, output[-3000:]
    entries = json.loads((work / f"logs/train_segment/{EXPERIMENT}/seg1.attempts.json").read_text())
    stop = entries[0]
    assert stop["failure"] == "signal" and stop["reached_iteration"] > 0, (stop, engine_log[-3000:])
    # Megatron-LM's stop on its --exit-signal, after a save of 35 s that torchrun (which
    # kills its workers 30 s after a SIGTERM) let finish: no kill, no time limit
    assert "exiting program after receiving SIGTERM." in engine_log, engine_log[-3000:]
    from hpcllm.training.campaign import signal_lead

    assert signal_lead.save_seconds(engine_log) >= SIGNAL_SAVE_SECONDS, engine_log[-3000:]
    for killed in ("forcefully exiting", "SIGKILL", "DUE TO TIME LIMIT", "Signal 9"):
        assert killed not in engine_log, (killed, engine_log[-3000:])
    # its checkpoint is complete (the record below: the next run resumed from it)
    checksums = f"iter_{stop['reached_iteration']:07d}/hpcllm_checksums.json"
    assert (work / "checkpoints" / EXPERIMENT / checksums).is_file()
    # the segment's log (one Slurm job per attempt: training.chain false, so that the
    # rule's own --signal is the job's): the launch (srun -> torchrun) ended with 0
    assert "engine exited with 0" in segment_log, segment_log[-3000:]
    # the second run resumes from that checkpoint and completes the segment
    assert second is not None and second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    record = json.loads((work / f"results/train/{EXPERIMENT}/seg1.json").read_text())
    assert record["resumed_from_iteration"] == stop["reached_iteration"]
    assert record["last_iteration"] == stop["reached_iteration"] + 2
    # its record keeps the longest save of its attempts and the checkpoint's size, and the
    # next plan states the --signal lead from them
    assert record["save_seconds"] >= SIGNAL_SAVE_SECONDS and record["checkpoint_bytes"] > 0
    text = " ".join((planned.stdout + planned.stderr).split())
    assert f"{EXPERIMENT}: Slurm's --signal=USR2 comes 90 s before the time limit" in text, text[
        -3000:
    ]
    assert f"a save took {record['save_seconds']:.0f} s in segment 1" in text
