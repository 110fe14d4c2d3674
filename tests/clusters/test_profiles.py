"""Every cluster profile: dry run and DAG picture on a machine without Slurm, the sbatch
line the Slurm plugin would build, and the plan-time errors for what is left unset."""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import stat
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from support import (  # noqa: E402
    REPO,
    hang_guard,
    make_workdir,
    run_snakemake,
    snakemake_bin,
    with_examples,
)

from hpcllm.clusters import load_cluster

PROFILES = sorted(
    p.parent.name
    for p in (REPO / "profiles").glob("*/config.yaml")
    if p.parent.name not in ("local", "testcluster", "rehearsal")  # test clusters
)
GPU_RULES = ("train_segment", "bench_language", "bench_vision")
SLURM_TOOLS = ("sbatch", "srun", "squeue", "sinfo", "sacct", "sacctmgr", "scontrol", "scancel")
# What a user exports before planning; the values are checked in the plan below.
USER_ENV = {
    "HPCLLM_ACCOUNT": "proj0042",
    "HPCLLM_GPU_PARTITION": "gpu-p",
    "HPCLLM_CPU_PARTITION": "cpu-p",
    "HPCLLM_DEVEL_PARTITION": "devel-p",
    "HPCLLM_QOS": "acc_x",
}


def profile(name: str) -> dict:
    return yaml.safe_load((REPO / "profiles" / name / "config.yaml").read_text())


@pytest.fixture(scope="module")
def imagenet_root(tmp_path_factory) -> str:
    """A small ImageNet-style tree where the user would point $HPCLLM_IMAGENET_ROOT."""
    from hpcllm.vision.sample_data import write_sample_tree

    root = tmp_path_factory.mktemp("imagenet") / "ILSVRC2012"
    write_sample_tree(
        root, "imagenet", classes=2, train_per_class=2, val_per_class=1, val_labels="folders"
    )
    return str(root)


@pytest.fixture(scope="module")
def no_slurm(tmp_path_factory) -> dict[str, str]:
    """An environment in which every Slurm command fails as if not installed."""
    bin_dir = tmp_path_factory.mktemp("noslurm")
    for tool in SLURM_TOOLS:
        (bin_dir / tool).write_text(f"#!/bin/sh\necho '{tool}: not installed' >&2\nexit 127\n")
        (bin_dir / tool).chmod(stat.S_IRWXU)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCLLM_", "SLURM_"))}
    return {**env, "PATH": f"{bin_dir}:{env['PATH']}"}


def planned_jobs(output: str) -> list[tuple[str, dict[str, str]]]:
    """(rule, resources) of every job a dry run lists."""
    jobs = []
    # Jobs of a group, if any, are listed indented under "Group job".
    for block in re.split(r"\n(?=\s*(?:local)?rule \w+:)", output):
        head = re.match(r"\s*(?:local)?rule (\w+):", block)
        res = re.search(r"^\s+resources: (.*)$", block, re.M)
        if head and res:
            pairs = (item.split("=", 1) for item in res.group(1).split(", "))
            jobs.append((head.group(1), dict(pairs)))
    return jobs


# A user's opt-in on top of the built-in config: a megatron training run and both sweeps
# (cut to 1 and 2 nodes on any cluster, so that every GPU rule is planned on every profile).
OPT_IN = (
    "config/experiments/opengptx_800m.yaml",
    str(REPO / "tests/data/opengptx_on_samples.yaml"),
)


def small_sweeps(path) -> str:
    language = yaml.safe_load((REPO / "config/experiments/language.yaml").read_text())
    language["models"] = {"gpt3_860m": language["models"]["gpt3_860m"]}
    language["models"]["gpt3_860m"].pop("max_nodes")
    vision = yaml.safe_load((REPO / "config/experiments/vision.yaml").read_text())
    for exp in (language, vision):
        exp["max_nodes"] = {"default": 2}
    sweeps = {"benchmarks": {"experiments": {"language": language, "vision": vision}}}
    path.write_text(yaml.safe_dump(sweeps))
    return str(path)


def copy_images_in(name: str, workdir) -> None:
    """Where the site builds no images (container_build.method: copy), the user copies
    them in first, as the plan says (tests/clusters/test_site_containers_offline.py)."""
    cluster = load_cluster(name, REPO / "config" / "clusters", environ=USER_ENV)
    if cluster.container_build.method == "copy":
        (workdir / "containers").mkdir(exist_ok=True)
        for image in ("megatron-nvidia", "vision-nvidia", "megatron-rocm"):
            (workdir / "containers" / f"{image}.sif").write_bytes(b"an image built elsewhere")


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory, no_slurm, imagenet_root):
    """The dry run of a profile with the opt-in files (each profile planned once)."""
    done: dict[str, str] = {}

    def plan(name: str) -> str:
        if name not in done:
            workdir = make_workdir(tmp_path_factory.mktemp(name))
            copy_images_in(name, workdir)
            env = {**no_slurm, **USER_ENV, "HPCLLM_IMAGENET_ROOT": imagenet_root}
            # one --configfile with several files (a second --configfile replaces the first)
            sweeps = small_sweeps(workdir / "sweeps.yaml")
            args = ["-n", "--profile", f"profiles/{name}", "--configfile", *OPT_IN, sweeps]
            proc = run_snakemake(workdir, *args, env=env, timeout=hang_guard(30))  # ~30 s
            done[name] = proc.stdout + proc.stderr
        return done[name]

    return plan


def job_resources(job_block_resources: dict[str, str]) -> dict:
    """A planned job's resources as the Slurm plugin sees them (numbers as numbers)."""
    return {k: _value(v) for k, v in job_block_resources.items() if v != "<TBD>"}


@pytest.mark.workflow
@pytest.mark.parametrize("name", PROFILES)
def test_dry_run_per_profile(name, dry_runs):
    out = dry_runs(name)
    jobs = planned_jobs(out)
    cluster = load_cluster(name, REPO / "config" / "clusters", environ=USER_ENV)
    rules = {rule for rule, _ in jobs}
    # Where every job holds a whole node, a node's worth of shards per tokenize job.
    tokenize = "tokenize_batch" if cluster.whole_nodes else "tokenize"
    assert {tokenize, "merge_tokenized", "train_tokenizer", "train_segment"} <= rules, rules
    assert not ({"tokenize", "tokenize_batch"} - {tokenize}) & rules, rules
    cpu_partition = cluster.partitions.cpu or cluster.partitions.gpu
    for rule, resources in jobs:
        if rule == "all":
            continue
        assert resources["slurm_account"] == "proj0042", (rule, resources)
        expected = cluster.partitions.gpu if rule in GPU_RULES else cpu_partition
        if rule in ("site_probe", "canary"):  # pre-flight: the devel partition where there is one
            expected = cluster.partitions.devel or cluster.partitions.gpu
        assert resources["slurm_partition"] == expected, (rule, resources)
    # GPU steps run in the cluster's image, built here unless the site builds none
    assert ("build_container" in rules) == (cluster.container_build.method != "copy"), rules
    # the cost of what it would queue, before anything is queued, and the limit
    assert re.search(rf"Cost on {name} .*\n(  \w+: .*GPU-hours\n)+  total: ", out), out[-3000:]
    exp = opt_in_training()
    # the time limit each segment job asks for (sized from its work, not a constant 24 h)
    runtimes = {int(r["runtime"]) for rule, r in jobs if rule == "train_segment"}
    assert len(runtimes) == 1 and 20 <= min(runtimes) < 1440, runtimes
    hours = exp["segments"] * exp["layout"]["nodes"] * min(runtimes) / 60
    assert f"train_segment: {exp['segments']} job(s), {hours:,.1f} node-hours" in out
    if cluster.partitions.cpu is None:  # CPU jobs hold whole GPU nodes: priced too
        for rule in (tokenize, "merge_tokenized", "train_tokenizer", "prepare_data_cache"):
            assert re.search(rf"\n  {rule}: \d+ job\(s\), [\d.,]+ node-hours", out), rule
        # ... said, with the site's reason and its source, and the index cache's limit is
        # sized from its samples, not 2 h of a GPU node
        said = re.search(rf"\nCPU-only jobs on GPU nodes on {name}: (.*): [\d.,]+ of the", out)
        assert said and "prepare_data_cache" in said.group(1), out[-3000:]
        assert f"Why: {cluster.no_cpu_partition}" in out
        cache = {int(r["runtime"]) for rule, r in jobs if rule == "prepare_data_cache"}
        assert cache and max(cache) < 120, cache
    else:  # on CPU nodes: nothing to say
        assert "CPU-only jobs on GPU nodes" not in out
    assert re.search(r"Time to train on .*\n  opengptx_800m: [\d.]+B tokens", out)
    # what a hang of a segment costs: its nodes until the watchdog's bound (the ceiling,
    # nothing measured yet), or until the time limit without it
    hang = re.search(
        rf"\nWhat a hang costs on {name} .*\n(?:  .*\n)*?  train_segment opengptx_800m: a hang "
        r"costs ([\d.,]+) GPU-hours with the watchdog \(\d+ nodes? x its bound of 60 min: the "
        r"ceiling, as nothing was measured yet\); ([\d.,]+) GPU-hours without it",
        out,
    )
    assert hang, out[out.find("What a hang") :][:2000]
    with_it, without = (float(g.replace(",", "")) for g in hang.groups())
    assert with_it == pytest.approx(without * min(60, min(runtimes)) / min(runtimes), rel=0.01)
    # ... and which of Megatron-LM's own features the segments use: the site probe, run
    # before the first segment, finds out (hpcllm.models.megatron_resiliency)
    assert re.search(
        r"\n  Megatron's straggler detector \(--log-straggler\): used where the site probe, "
        r"run before the first segment, finds it able to run .*\n  Megatron's in-process "
        r"restart \(--inprocess-restart\): the site probe, run before the first segment, "
        r"finds out; not enabled either way: .*; the watchdog covers every engine\n",
        out,
    ), out[out.find("What a hang") :][:3000]
    # ... and when, from the plan's model rate (no segment ran; nothing measured a wait),
    # with its 80 % interval
    line = re.search(
        r"When training will finish .*\n  opengptx_800m: expected to finish: "
        r"\d{4}-\d\d-\d\d \d\d:\d\d(:\d\d)? \w+ \(80 % interval: [^)]+\), from: "
        r"([\d.e+-]+) s/iteration from (the plan's model estimate: FLOPs at the assumed "
        r"[\d.]+ TFLOP/s per GPU|the layout table's predicted s/iteration) \(not measured: "
        rf"range ±25%, assumed\), {exp['segments']} segments and {exp['segments']} jobs left, "
        r"start-up and save 5 min per segment \(assumed, not measured\), queue wait "
        r"unknown, not included",
        out,
    )
    assert line, out[-3000:]
    chosen = re.search(r"\n  \S+ +[\d.]+GB +([\d.e+-]+) .*<-\n", out)
    if chosen:  # layout: auto: one rate model per plan, the layout table's
        assert "layout table" in line.group(3)
        assert float(line.group(2)) == pytest.approx(float(chosen.group(1)), rel=5e-3)
    total = re.search(r"\n  total: [\d.,]+ node-hours, ([\d.,]+) GPU-hours", out)
    if float(total.group(1).replace(",", "")) > 500:
        assert "more than max_gpu_hours = 500" in out
        assert f"--config cluster={name} max_gpu_hours=" in out
    else:  # faster GPUs: the work sized time limits keep it under the default limit
        assert "more than max_gpu_hours" not in out


@pytest.mark.workflow
@pytest.mark.parametrize("name", PROFILES)
def test_dag_per_profile(name, tmp_path, no_slurm, imagenet_root):
    if shutil.which("dot") is None:
        pytest.skip("Graphviz dot missing")
    workdir = make_workdir(tmp_path / "work")
    copy_images_in(name, workdir)
    env = {**no_slurm, **USER_ENV, "HPCLLM_IMAGENET_ROOT": imagenet_root}
    dag = run_snakemake(workdir, "--dag", "--profile", f"profiles/{name}", env=env)
    svg = subprocess.run(
        ["dot", "-Tsvg"], input=dag.stdout, capture_output=True, text=True, check=True
    ).stdout
    assert "<svg" in svg and "tokenize" in svg


@pytest.mark.workflow
def test_a_real_run_over_max_gpu_hours_submits_nothing(tmp_path, no_slurm):
    workdir = make_workdir(tmp_path / "work")
    env = with_apptainer({**no_slurm, **USER_ENV}, tmp_path)
    args = ["--profile", "profiles/juwels", "--configfile", *OPT_IN]
    out = _fails(workdir, *args, env=env)
    asked = re.search(r"Nothing was submitted: this plan asks for ([\d,.]+) GPU-hours", out)
    assert asked, out[-3000:]
    limit = int(float(asked.group(1).replace(",", ""))) + 1
    assert f"--config cluster=juwels max_gpu_hours={limit}" in out
    assert "not installed" not in out  # no Slurm command was even tried
    # the way out it names, as a dry run: the same plan, no warning
    out = run_snakemake(
        workdir, "-n", *args, "--config", "cluster=juwels", f"max_gpu_hours={limit}", env=env
    )
    text = out.stdout + out.stderr
    assert f", {asked.group(1)} GPU-hours" in text and "more than" not in text


@pytest.mark.workflow
def test_look_only_commands_over_max_gpu_hours_still_answer(tmp_path, no_slurm):
    """--dag (piped into dot by the README) and --summary of a plan over the budget: the
    output, not a traceback and an empty picture (they submit nothing: no cost check)."""
    workdir = make_workdir(tmp_path / "work")
    args = ["--profile", "profiles/juwels", "--configfile", *OPT_IN]
    env = {**no_slurm, **USER_ENV}
    dag = run_snakemake(workdir, "--dag", *args, env=env)
    assert dag.stdout.lstrip().startswith("digraph") and "train_segment" in dag.stdout
    assert "Traceback" not in dag.stderr
    # the picture the README draws of it folds the segments into one box (hpcllm dag)
    from hpcllm.dag import fold

    assert re.search(r'label = "train_segment\\n\d+ jobs\\nk: 1…\d+"', fold(dag.stdout))
    summary = run_snakemake(workdir, "--summary", *args, env=env)
    assert "results/train/opengptx_800m/seg1.json" in summary.stdout


def with_apptainer(env: dict[str, str], tmp_path) -> dict[str, str]:
    """``env`` with an `apptainer` on the PATH, as on a JUWELS login node: a real run checks
    for the build tool while it builds the DAG, before the cost; it is never run here."""
    bin_dir = tmp_path / "apptainer-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "apptainer").write_text(
        "#!/bin/sh\necho 'apptainer: not run in this test' >&2\nexit 1\n"
    )
    (bin_dir / "apptainer").chmod(stat.S_IRWXU)
    return {**env, "PATH": f"{bin_dir}:{env['PATH']}"}


def cost_of(out: str, rule: str) -> tuple[int, float]:
    """The jobs and GPU-hours a plan's cost lines give ``rule`` ((0, 0) without a line)."""
    line = re.search(rf"\n  {rule}: (\d+) job\(s\), [\d.,]+ node-hours, ([\d.,]+) GPU", out)
    return (int(line.group(1)), float(line.group(2).replace(",", ""))) if line else (0, 0.0)


@pytest.mark.workflow
def test_the_cost_prices_the_jobs_snakemake_runs_not_the_missing_files(tmp_path, no_slurm):
    """With every benchmark record on disk, --forcerun bench_language and -F still run all
    the points: the plan prices them and a real run over the limit submits nothing (the
    cost used to count only points whose record was missing: 0 of them here)."""
    workdir = make_workdir(tmp_path / "work")
    language = yaml.safe_load((REPO / "config/experiments/language.yaml").read_text())
    language["models"] = {"gpt3_860m": language["models"]["gpt3_860m"]}
    language["models"]["gpt3_860m"].pop("max_nodes")
    language["max_nodes"] = {"default": 2}
    sweeps = tmp_path / "sweeps.yaml"
    sweeps.write_text(yaml.safe_dump({"benchmarks": {"experiments": {"language": language}}}))
    for name in ("megatron-nvidia.sif", "megatron-nvidia.digest.json"):  # the image, built
        (workdir / "containers").mkdir(exist_ok=True)
        (workdir / "containers" / name).write_text("{}")
    args = ["--profile", "profiles/juwels", "--configfile", str(sweeps)]
    env = {**no_slurm, **USER_ENV}
    first = run_snakemake(workdir, "-n", *args, env=env)
    out = first.stdout + first.stderr
    points, hours = cost_of(out, "bench_language")
    assert points >= 2 and hours > 0, out[-3000:]
    records = set(re.findall(r"results/bench/language/[^/\s]+/run\.json", out))
    assert len(records) == points
    for record in records:  # every point's result there, newer than its inputs
        (workdir / record).parent.mkdir(parents=True, exist_ok=True)
        (workdir / record).write_text("{}")
    again = run_snakemake(workdir, "-n", *args, "--until", "bench_language", env=env)
    assert cost_of(again.stdout + again.stderr, "bench_language") == (0, 0.0)
    for force in (["--forcerun", "bench_language"], ["-F"]):
        plan = run_snakemake(workdir, "-n", *args, *force, env=env)
        assert cost_of(plan.stdout + plan.stderr, "bench_language") == (points, hours), force
    limit = f"max_gpu_hours={int(hours) // 2}"
    env = with_apptainer(env, tmp_path)
    out = _fails(workdir, *args, "--forcerun", "bench_language", "--config", limit, env=env)
    assert "Nothing was submitted: this plan asks for" in out, out[-3000:]
    assert "not installed" not in out  # no Slurm command was even tried


@pytest.mark.workflow
def test_a_command_line_config_keeps_the_profiles_cluster(tmp_path, no_slurm):
    """`--config key=value` replaces the profile's `config:` (which names the cluster):
    the plan stays on JUWELS (its cost, partitions, time limits), not the laptop's."""
    workdir = make_workdir(tmp_path / "work")
    env = {**no_slurm, **USER_ENV}
    args = ["-n", "--profile", "profiles/juwels", "--configfile", *OPT_IN]
    proc = run_snakemake(workdir, *args, "--config", "max_gpu_hours=1000", env=env)
    out = proc.stdout + proc.stderr
    assert "cluster: juwels (from " in out and "Cost on juwels" in out
    assert "more than max_gpu_hours" not in out  # the command line's limit counts too
    segments = [r for rule, r in planned_jobs(out) if rule == "train_segment"]
    assert segments and all(r["slurm_partition"] == "booster" for r in segments)
    # naming another cluster than the profile's is refused, naming both
    out = _fails(workdir, *args, "--config", "cluster=local", env=env)
    assert "--config cluster=local on the command line, but the profile" in out
    assert "is for cluster 'juwels'" in out


@pytest.mark.workflow
def test_jobs_get_the_profiles_cluster_on_their_command_line(tmp_path, no_slurm):
    """The jobs re-read the workflow with the command line's --config (not the profile's):
    the cluster read from the profile is passed on to them. Captured from the official
    plugin's sbatch call of one tokenize job; a stand-in sbatch records its arguments."""
    workdir = make_workdir(tmp_path / "work")
    for path in ("data/tokenizers/sample_bpe/tokenizer.json",):
        (workdir / path).parent.mkdir(parents=True, exist_ok=True)
        (workdir / path).touch()
    bin_dir, record = tmp_path / "bin", tmp_path / "sbatch.args"
    bin_dir.mkdir()
    tools = {
        "sbatch": f'echo "$@" >> {record}\necho "Submitted batch job 4242"',
        "sacctmgr": "echo proj0042",
    }
    for tool in ("sbatch", "srun", "squeue", "sinfo", "sacct", "sacctmgr", "scontrol", "scancel"):
        (bin_dir / tool).write_text(f"#!/bin/sh\n{tools.get(tool, 'exit 0')}\n")
        (bin_dir / tool).chmod(stat.S_IRWXU)
    env = {**no_slurm, **USER_ENV, "PATH": f"{bin_dir}:{no_slurm['PATH']}", "HF_HUB_OFFLINE": "1"}
    target = "data/tokenized/sample_bpe/sample_en/0000_text_document.bin"
    cmd = [snakemake_bin(), "-s", str(REPO / "Snakefile"), "-d", str(workdir)]
    cmd += with_examples(["--profile", "profiles/juwels", target, "--config", "max_gpu_hours=1000"])
    err = open(workdir / "snakemake.err", "w")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=err, stderr=err)
    try:  # the job is submitted within ~15 s; the plugin then polls until stopped
        deadline = time.monotonic() + hang_guard(15)
        while not record.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        proc.kill()  # it would wait for the stand-in job to end
        proc.wait()
        err.close()
    assert record.exists(), (workdir / "snakemake.err").read_text()[-3000:]
    args = record.read_text()
    assert "--config" in args and "max_gpu_hours=1000" in args
    assert "cluster='juwels'" in args, args


@pytest.mark.workflow
def test_plain_cluster_run_is_what_a_user_expects(tmp_path, no_slurm):
    """No CPU example (tiny_local), no sweeps and no ImageNet needed by default."""
    workdir = make_workdir(tmp_path / "work")
    proc = run_snakemake(
        workdir, "-n", "--profile", "profiles/juwels", env={**no_slurm, **USER_ENV}
    )
    out = proc.stdout + proc.stderr
    rules = {rule for rule, _ in planned_jobs(out)}
    assert {"tokenize_batch", "merge_tokenized"} <= rules
    assert not rules & {"train_segment", "bench_language", "bench_vision", "pack_lmdb"}, rules
    # the CPU jobs hold whole Booster nodes there (no CPU partition): priced, not "0 hours"
    assert re.search(r"Cost on juwels .*\n(  \w+: .*GPU-hours\n)+  total: ", out), out[-3000:]
    # priced for its time limit (sized from the batch's input bytes: well under an hour here)
    batch = re.search(r"\n  tokenize_batch: \d+ job\(s\), ([\d.,]+) node-hours", out)
    assert batch and float(batch.group(1)) > 0, out[out.find("Cost on") :][:1500]
    assert "no jobs that hold GPU nodes" not in out


class _Resources(dict):
    __getattr__ = dict.__getitem__


def _value(raw):
    """A profile resource as Snakemake evaluates it: environment variables expanded, a
    Python literal taken as such (the quoted 'all' on JEDI), other text as text."""
    if not isinstance(raw, str):
        return raw
    text = os.path.expandvars(raw)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def submit_command(rule: str, resources: dict) -> str:
    """The Slurm plugin's own sbatch line for a planned job's resources."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string
    from snakemake_executor_plugin_slurm.validation import validate_slurm_extra

    res = _Resources(resources)
    job = SimpleNamespace(resources=res, threads=1, name=rule, is_group=lambda: False)
    if "slurm_extra" in res:  # as the plugin checks it
        validate_slurm_extra(job)
    return get_submit_command(
        job,
        {
            "run_uuid": "u",
            "slurm_logfile": "l",
            "comment_str": rule,
            "account": f"-A {res['slurm_account']}",
            "partition": f"-p {res['slurm_partition']}",
            "workdir": "/w",
        },
    ) + set_gres_string(job)


@pytest.mark.workflow
@pytest.mark.parametrize("name", PROFILES)
def test_sbatch_line_of_the_gpu_rules(name, dry_runs):
    """The Slurm plugin's own submit string for every GPU job the dry run plans, from the
    resources the workflow and the profile give it (nothing copied into this test)."""
    from hpcllm.training.campaign.chain import sbatch_geometry

    cfg = profile(name)
    cluster = load_cluster(name, REPO / "config" / "clusters", environ=USER_ENV)
    assert cfg["executor"] == "slurm" and cfg["config"]["cluster"] == name
    assert cfg["default-resources"]["slurm_account"] == "$HPCLLM_ACCOUNT"
    assert cfg["latency-wait"] >= 30
    experiment = opt_in_training()
    seen = set()
    for rule, planned in planned_jobs(dry_runs(name)):
        if rule not in GPU_RULES:
            continue
        seen.add(rule)
        res = job_resources(planned)
        call = submit_command(rule, res)
        assert f"-p {cluster.partitions.gpu}" in call and "-A proj0042" in call
        assert f"--nodes={res['nodes']}" in call
        # one task per node: torchrun starts one process per GPU inside it
        assert "--ntasks-per-node=1" in call, call
        assert f"--gres=gpu:{cluster.gpus_per_node}" in call and "--gpus" not in call
        assert f"--cpus-per-task={cluster.cpus_per_node}" in call
        assert "--ntasks-per-gpu" not in call
        if rule == "train_segment":
            assert res["nodes"] == experiment["layout"]["nodes"]
            assert f"--signal=USR2@{experiment['time']['signal_seconds']}" in call, call
            # training.chain submits the segment jobs itself, with the same options (all
            # but the plugin's job name, log, comment and working directory)
            words = shlex.split(call)
            workdir = words.index("-D")
            assert sbatch_geometry(res) == words[9:workdir] + words[workdir + 2 :], call
        else:
            assert "--exclusive" in call, call  # timings on nodes of their own
        if "qos" in res:
            assert "--qos=" in call and "$" not in call
    assert seen == set(GPU_RULES), seen


# The QOS the profile gives the GPU jobs of the sites whose development is a QOS
# (config/clusters: devel_qos); Leonardo's profile sets none (boost_usr_prod's normal).
GPU_JOBS_QOS = {"leonardo": None, "meluxina": "default", "mn5": "acc_x"}


@pytest.mark.workflow
@pytest.mark.parametrize("name", sorted(GPU_JOBS_QOS))
def test_the_preflight_jobs_run_in_the_development_qos(name, dry_runs):
    """The site probe and the canaries are submitted in the cluster file's development QOS
    on the GPU partition (these sites have no devel partition), not in the production
    queue; the GPU jobs keep the profile's QOS."""
    cluster = load_cluster(name, REPO / "config" / "clusters", environ=USER_ENV)
    seen, signals = set(), set()
    for rule, planned in planned_jobs(dry_runs(name)):
        res = job_resources(planned)
        if rule in ("site_probe", "canary"):
            seen.add(rule)
            assert res["qos"] == cluster.devel_qos.name, (rule, res)
            call = submit_command(rule, res)
            assert f"--qos={cluster.devel_qos.name}" in call, call
            nodes = 1 if rule == "site_probe" else 2  # a canary of multi-node jobs: two
            assert f"-p {cluster.partitions.gpu} " in call and f"--nodes={nodes}" in call, call
            if rule == "canary":  # the segments' signal for the training canary
                signals.add(re.search(r"--signal=(\w+)@", res["slurm_extra"]).group(1))
        elif rule in GPU_RULES:
            assert res.get("qos") == GPU_JOBS_QOS[name], (rule, res)
    assert seen == {"site_probe", "canary"}, seen
    assert signals == {"USR2", "TERM"}, signals  # training's canary; the benchmarks'


@pytest.mark.parametrize("name", PROFILES)
def test_no_profile_moves_the_preflight_out_of_the_cluster_files_queue(name):
    """The pre-flight's partition and QOS are cluster facts (partitions.devel, devel_qos);
    a profile's set-resources for its rules would override them without a word."""
    sets = profile(name).get("set-resources", {})
    for rule in ("site_probe", "canary"):
        assert not {"qos", "slurm_partition"} & set(sets.get(rule, {})), (name, rule)


def opt_in_training() -> dict:
    """The opt-in training experiment (its layout and signal time are checked)."""
    cfg = yaml.safe_load((REPO / OPT_IN[0]).read_text())
    return cfg["training"]["experiments"]["opengptx_800m"]


def _fails(workdir, *args, env) -> str:
    proc = run_snakemake(workdir, *args, env=env, check=False, timeout=hang_guard(15))  # ~15 s
    assert proc.returncode != 0, proc.stdout[-2000:]
    return proc.stdout + proc.stderr


@pytest.mark.workflow
def test_plan_time_errors_say_what_to_set(tmp_path, no_slurm):
    workdir = make_workdir(tmp_path / "work")
    env = {**no_slurm, **USER_ENV}
    out = _fails(
        workdir, "-n", "--profile", "profiles/juwels", "--config", "cluster=juwles", env=env
    )
    assert "unknown cluster 'juwles'" in out and "juwels" in out
    no_account = {k: v for k, v in env.items() if k != "HPCLLM_ACCOUNT"}
    out = _fails(workdir, "-n", "--profile", "profiles/juwels", env=no_account)
    assert "slurm_account from $HPCLLM_ACCOUNT, which is not set" in out
    assert "export HPCLLM_ACCOUNT=" in out
    no_partition = {k: v for k, v in env.items() if k != "HPCLLM_GPU_PARTITION"}
    out = _fails(workdir, "-n", "--profile", "profiles/discoverer", env=no_partition)
    assert "discoverer.yaml: partitions.gpu is not known for sure" in out
    assert "export HPCLLM_GPU_PARTITION=" in out
    # A real run needs the container runtime; this machine has none: stop before submitting.
    out = _fails(workdir, "--profile", "profiles/juwels", "containers/megatron-nvidia.sif", env=env)
    assert "'apptainer' is not on the PATH" in out and "container_runtime: none" in out
    assert not (workdir / "containers" / "megatron-nvidia.sif").exists()


# ---- issue 21: the geometry of every GPU job against the site facts

LOCAL_IMPL_FLAGS = ("--no-rope-fusion", "--no-gradient-accumulation-fusion")


def planned_blocks(output: str) -> list[tuple[str, dict[str, str]]]:
    """(rule, {input, wildcards, resources}) of every Slurm job a dry run lists (login-node
    rules, "localrule", are left out)."""
    jobs = []
    for block in re.split(r"\n(?=\s*(?:local)?rule \w+:)", output):
        head = re.match(r"\s*rule (\w+):", block)
        if head:
            fields = dict(re.findall(r"^\s+(input|wildcards|resources): (.*)$", block, re.M))
            jobs.append((head.group(1), fields))
    return jobs


def the_jobs_launch(rule: str, fields: dict[str, str], cluster, tmp_path):
    """The launch the planned job's script builds, from what the dry run planned: the
    point or segment of its wildcards, the image of its input."""
    from hpcllm.bench.language import language_launch
    from hpcllm.bench.runner import vision_launch
    from hpcllm.bench.sweeps import expand_all, facts_of
    from hpcllm.launch import python_for
    from hpcllm.models.megatron_args import transformer_impl_for
    from hpcllm.training.campaign.engine_process import segment_launch
    from hpcllm.training.engines.command import engine_command
    from hpcllm.training.plan.experiment import Paths, prepare_experiment

    wildcards = dict(item.split("=", 1) for item in fields["wildcards"].split(", "))
    (container,) = [f for f in fields["input"].split(", ") if f.endswith(".sif")]
    if rule == "train_segment":
        name = wildcards["experiment"]
        # the experiment as the opt-in config files give it, the later file's data keys last
        spec: dict = {}
        for path in OPT_IN:
            one = yaml.safe_load((REPO / path).read_text())["training"]["experiments"][name]
            spec = {**spec, **one, "data": {**spec.get("data", {}), **one.get("data", {})}}
        text = {
            "tokenizers": {"sample_bpe": {"vocab_size": 8000}},
            "tokenize": {"tokenizers": ["sample_bpe"]},
            "sources": {"fineweb": {}},
        }
        prepared = prepare_experiment(name, spec, text, cluster)
        save = str(tmp_path / "ckpt")
        paths = Paths(save, "r.json", "e.log", f"{save}/cache", f"{save}/tb")
        command = engine_command(
            prepared.experiment,
            prepared.layout,
            prepared.blend,
            prepared.tokenizer_files,
            paths,
            int(wildcards["k"]),
            1425,
            eod_token=prepared.eod_token,
            transformer_impl=transformer_impl_for(cluster),
            python=python_for(container),
        )
        return segment_launch(prepared.experiment, command, cluster, container)
    sweeps = yaml.safe_load(Path(small_sweeps(tmp_path / "sweeps.yaml")).read_text())
    points = {
        p.id: p.row() for p in expand_all(sweeps["benchmarks"]["experiments"], facts_of(cluster))
    }
    point = points[wildcards["point"]]
    if rule == "bench_language":
        return language_launch(point, tmp_path / "run", cluster, container)
    return vision_launch(point, "train.lmdb", str(tmp_path / "s.json"), cluster, container)


@pytest.mark.workflow
@pytest.mark.parametrize("name", PROFILES)
def test_site_geometry_of_every_gpu_job(name, dry_runs, tmp_path):
    """For every GPU job the dry run plans, its sbatch line (the plugin's) and its launch
    script against the cluster's facts: GPUs and one task per node, cores per task within
    the node's, cores rather than hardware threads where Slurm counts those, the CPU
    binding, OMP_NUM_THREADS = cores per GPU, the Hugging Face offline variables, and
    Megatron without the fusions that need Transformer Engine where it is missing."""
    from hpcllm.clusters import OFFLINE_ENV
    from hpcllm.models.megatron_args import transformer_impl_for

    cluster = load_cluster(name, REPO / "config" / "clusters", environ=USER_ENV)
    gpus = cluster.gpus_per_node
    seen = set()
    for rule, fields in planned_blocks(dry_runs(name)):
        if "resources" not in fields:  # a login-node rule
            continue
        resources = dict(item.split("=", 1) for item in fields["resources"].split(", "))
        sbatch = submit_command(rule, job_resources(resources))
        # every Slurm job, CPU ones too: cores where Slurm's CPUs are hardware threads
        assert ("--threads-per-core=1" in sbatch) == (cluster.threads_per_core > 1), sbatch
        if rule not in GPU_RULES:
            continue
        seen.add(rule)
        assert f"--gres=gpu:{gpus}" in sbatch and "--ntasks-per-node=1" in sbatch, sbatch
        cpus = int(re.search(r"--cpus-per-task=(\d+)", sbatch).group(1))
        assert cpus <= cluster.cpus_per_node, sbatch  # cores; one task per node

        launch = the_jobs_launch(rule, fields, cluster, tmp_path)
        argv, script = launch.argv, launch.shell()
        srun = argv[: argv.index(next(a for a in argv if a in ("apptainer", "singularity")))]
        assert srun[srun.index("--ntasks-per-node") + 1] == "1"
        assert int(argv[argv.index("--nproc_per_node") + 1]) <= gpus  # ranks per node
        if cluster.gpu_cpu_masks:  # LUMI, JUPITER, JEDI: each rank on its GPU's cores
            union = 0
            for mask in cluster.gpu_cpu_masks:
                union |= int(mask, 16)
            assert f"--cpu-bind=mask_cpu:{union:#x}" in srun and "--cpu-bind=none" not in srun
            masks = ",".join(cluster.gpu_cpu_masks)
            assert argv[argv.index("--no-python") + 4] == masks  # python -c CODE masks
        else:
            assert all(a in srun for a in cluster.srun_args)
        assert not re.search(r"libfabric/\d", script)  # no version written in a path
        # each rank's share of the task's cores: cores per GPU
        assert f"\nexport OMP_NUM_THREADS={cpus // gpus}\n" in script, script
        assert cpus // gpus == cluster.cores_per_gpu
        assert all(f"\nexport {k}={v}\n" in script for k, v in OFFLINE_ENV.items())
        if "pretrain_gpt.py" in " ".join(argv):
            local = transformer_impl_for(cluster) == "local"  # no Transformer Engine
            assert all((flag in argv) == local for flag in LOCAL_IMPL_FLAGS), (name, rule)
    assert seen == set(GPU_RULES), seen
