"""The site probe's checks (hpcllm.preflight.probe) against a cluster's facts.

The GPU tools cannot run here: `nvidia-smi` is a script printing what NVIDIA's prints.
Everything else (imports, storage, the facts comparison) is real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcllm.clusters import load_cluster
from hpcllm.preflight import probe
from hpcllm.preflight.canary import language_canary_point, one_node_layout, rerun_warning

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "config", "clusters")


def juwels():
    return load_cluster("juwels", root=ROOT)


def test_inside_reports_each_modules_import_error(tmp_path):
    (tmp_path / "only_in_the_image.py").write_text("")
    out = subprocess.run(
        [sys.executable, "-m", "hpcllm.preflight.inside", "--sys-path", str(tmp_path),
         "json", "only_in_the_image", "hpcllm_no_such_module"],
        capture_output=True, text=True, check=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    modules = json.loads(out.stdout.splitlines()[-1])["modules"]
    assert modules["json"] is None and modules["only_in_the_image"] is None
    assert modules["hpcllm_no_such_module"].startswith("ModuleNotFoundError")


def inside_report(tmp_path, *modules, sys_path=None):
    out = subprocess.run(
        [sys.executable, "-m", "hpcllm.preflight.inside",
         *(["--sys-path", str(sys_path)] if sys_path else []), *modules],
        capture_output=True, text=True, check=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    return json.loads(out.stdout.splitlines()[-1])


OLD_TORCH = {
    "torch/__init__.py": '__version__ = "2.6.0"\n',
    "torch/distributed/__init__.py": "",
    # torchrun's parser before PyTorch PR 172596: no --shutdown-timeout
    "torch/distributed/run.py": "import argparse\n"
    "def get_args_parser():\n"
    "    p = argparse.ArgumentParser()\n"
    "    p.add_argument('--nproc-per-node')\n"
    "    return p\n",
}


def test_inside_reports_torch_and_whether_torchrun_has_the_shutdown_timeout(tmp_path):
    import torch

    report = inside_report(tmp_path, "torch", "torch.distributed.run")
    assert report["torch"] == torch.__version__
    assert report["torchrun_shutdown_timeout"] is True  # this venv's torch has it
    old = tmp_path / "old"
    for name, text in OLD_TORCH.items():
        (old / name).parent.mkdir(parents=True, exist_ok=True)
        (old / name).write_text(text)
    report = inside_report(tmp_path, "torch", "torch.distributed.run", sys_path=old)
    assert report["torch"] == "2.6.0" and report["torchrun_shutdown_timeout"] is False
    report = inside_report(tmp_path, "json")
    assert report["torch"] is None and report["torchrun_shutdown_timeout"] is None


def test_plan_warns_where_the_images_torchrun_cuts_the_signal_lead(tmp_path):
    record = tmp_path / "probe.json"
    leads = {"opengptx_800m": 300, "tiny": 30}
    assert probe.signal_lead_warning(record, leads) is None  # no probe yet
    inside = {"torch": "2.6.0", "torchrun_shutdown_timeout": False}
    record.write_text(json.dumps({"image": "megatron-rocm", "job_id": "42", "inside": inside}))
    warning = probe.signal_lead_warning(record, leads)
    assert "torch 2.6.0 in megatron-rocm" in warning and "job 42" in warning
    assert "opengptx_800m (300 s)" in warning and "tiny" not in warning
    assert "30 s" in warning and "PR 172596" in warning
    # the fallback before the time limit is SIGUSR2, which torchrun ignores: not affected
    assert "SIGTERM to the job (a plain scancel, a preemption)" in warning
    assert "before the time limit is not affected" in warning
    assert probe.signal_lead_warning(record, {"tiny": 30}) is None  # 30 s is all it asks
    inside["torchrun_shutdown_timeout"] = True
    record.write_text(json.dumps({"image": "megatron-rocm", "job_id": "42", "inside": inside}))
    assert probe.signal_lead_warning(record, leads) is None
    record.write_text(json.dumps({"image": "megatron-rocm", "job_id": "42"}))  # older record
    assert probe.signal_lead_warning(record, leads) is None


def fake_nvidia_smi(tmp_path, monkeypatch, names):
    tool = tmp_path / "nvidia-smi"
    lines = "".join(f"echo 'GPU {i}: {n} (UUID: GPU-{i})'\n" for i, n in enumerate(names))
    tool.write_text(f"#!/bin/sh\n{lines}")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize(
    "names, ok",
    [
        (["NVIDIA A100-SXM4-40GB"] * 4, True),
        (["NVIDIA A100-SXM4-40GB"] * 3, False),  # a GPU missing
        (["NVIDIA H100 80GB HBM3"] * 4, False),  # another GPU than the facts say
    ],
)
def test_gpus_against_the_facts(tmp_path, monkeypatch, names, ok):
    fake_nvidia_smi(tmp_path, monkeypatch, names)
    found = probe.check_gpus(juwels())
    assert found["ok"] is ok, found
    assert "4 x A100-SXM4-40GB" in found["detail"] and f"{len(names)} x" in found["detail"]


def test_gpus_without_the_tool(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    found = probe.check_gpus(juwels())
    assert not found["ok"] and "nvidia-smi" in found["detail"]


def gh200_node(tmp_path, monkeypatch, cpulists):
    """nvidia-smi's GPUs 0-3 at JUPITER's PCI addresses, and their sysfs local_cpulist."""
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir(parents=True)
    lines = "".join(f"echo '{i}, 000000{i}9:01:00.0'\n" for i in range(len(cpulists)))
    tool.write_text(f"#!/bin/sh\n{lines}")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    sysfs = tmp_path / "devices"
    for i, cpulist in enumerate(cpulists):
        (sysfs / f"00{i}9:01:00.0").mkdir(parents=True)
        (sysfs / f"00{i}9:01:00.0" / "local_cpulist").write_text(cpulist + "\n")
    return str(sysfs)


CHIPS = ["0-71", "72-143", "144-215", "216-287"]


@pytest.mark.parametrize("name", ["jupiter", "jedi"])
def test_each_gpus_mask_is_checked_against_the_cores_linux_lists_for_it(
    tmp_path, monkeypatch, name
):
    """JUPITER's masks pair GPU i with Grace chip i, which JSC's pages do not state: the
    probe compares them with each GPU's local_cpulist, and fails on another order."""
    cluster = load_cluster(name, root=ROOT, environ={"HPCLLM_DEVEL_PARTITION": "d"})
    found = probe.check_gpu_cores(cluster, gh200_node(tmp_path / "a", monkeypatch, CHIPS))
    assert found["ok"], found
    assert "every mask within its GPU's cores (4 GPUs)" in found["detail"]
    swapped = [CHIPS[1], CHIPS[0], *CHIPS[2:]]
    found = probe.check_gpu_cores(cluster, gh200_node(tmp_path / "b", monkeypatch, swapped))
    assert not found["ok"]
    assert "GPU 0: the mask's cores 0-71, its own 72-143" in found["detail"]
    assert "GPU 1: the mask's cores 72-143, its own 0-71" in found["detail"]
    assert "GPU 2" not in found["detail"] and f"{name}.yaml" in found["detail"]
    three = probe.check_gpu_cores(cluster, gh200_node(tmp_path / "c", monkeypatch, CHIPS[:3]))
    assert not three["ok"] and "GPU 3: the mask's cores 216-287, its own none" in three["detail"]


def test_gpu_cores_unreadable_fail_the_check(tmp_path, monkeypatch):
    cluster = load_cluster("jupiter", root=ROOT, environ={"HPCLLM_DEVEL_PARTITION": "d"})
    gh200_node(tmp_path, monkeypatch, CHIPS)
    found = probe.check_gpu_cores(cluster, str(tmp_path / "elsewhere"))
    assert not found["ok"] and "local_cpulist" in found["detail"]
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    found = probe.check_gpu_cores(cluster)
    assert not found["ok"] and "nvidia-smi" in found["detail"]


def test_storage_writable_with_free_space_unset_variable_and_unwritable(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCLLM_TEST_SCRATCH", str(tmp_path))
    found = probe.check_storage("scratch", "$HPCLLM_TEST_SCRATCH", "facts.yaml")
    assert found["ok"] and "GB free" in found["detail"] and str(tmp_path) in found["detail"]
    assert not list(tmp_path.iterdir())  # the probe's file is gone
    monkeypatch.delenv("HPCLLM_TEST_SCRATCH")
    unset = probe.check_storage("scratch", "$HPCLLM_TEST_SCRATCH", "facts.yaml")
    assert not unset["ok"] and "not set" in unset["detail"]
    (tmp_path / "a-file").write_text("")
    unwritable = probe.check_storage("local_storage", str(tmp_path / "a-file"), "facts.yaml")
    assert not unwritable["ok"] and "not writable" in unwritable["detail"]


@pytest.mark.parametrize(
    "reached, compute, ok",
    [(False, False, True), (True, True, True), (True, False, True), (False, True, False)],
)
def test_internet_against_the_facts(monkeypatch, reached, compute, ok):
    import dataclasses

    monkeypatch.setattr(probe, "reaches", lambda host: (reached, f"{host}:443"))
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example")
    cluster = juwels()
    cluster = dataclasses.replace(
        cluster, internet=dataclasses.replace(cluster.internet, compute=compute)
    )
    found = probe.check_internet(cluster)
    assert found["ok"] is ok, found
    assert "hub.example:443" in found["detail"]


def test_modules_of_each_image():
    cluster = juwels()
    train = probe.image_modules(cluster, "train", {"megatron"})
    assert {"megatron.core.datasets.helpers_cpp", "tensorboard", "transformer_engine"} <= set(train)
    assert "torchrun_jsc" in train  # JSC's launcher
    vision = probe.image_modules(cluster, "vision", vision_impls={"torchvision"})
    assert {"torchvision", "lmdb", "hpcllm.bench.vision_train"} <= set(vision)
    assert "lm_eval" not in train
    evaluated = probe.image_modules(cluster, "train", {"megatron"}, evaluate=True)
    assert {"lm_eval", "hpcllm.evaluation.run"} <= set(evaluated)  # evaluate_tasks' imports
    lumi = load_cluster("lumi", root=ROOT)  # ROCm: Megatron's own layers, no TE
    assert "transformer_engine" not in probe.image_modules(lumi, "train", {"megatron"})


def test_probe_key_changes_with_what_it_checks():
    cluster = juwels()
    key = probe.probe_key(cluster, "containers/a.sif", ["torch"])
    assert key == probe.probe_key(cluster, "containers/a.sif", ["torch"])
    assert key != probe.probe_key(cluster, "containers/b.sif", ["torch"])
    assert key != probe.probe_key(cluster, "containers/a.sif", ["torch", "lmdb"])
    assert key != probe.probe_key(load_cluster("jureca", root=ROOT), "containers/a.sif",
                                  ["torch"])  # fmt: skip


@pytest.mark.parametrize(
    "tp, pp, gpus, expected",
    [(2, 1, 4, (2, 1, 2)), (8, 16, 4, (4, 1, 1)), (2, 2, 2, (2, 1, 1)), (1, 4, 8, (1, 4, 2))],
)
def test_one_node_keeps_what_fits_of_the_layout(tp, pp, gpus, expected):
    assert one_node_layout(tp, pp, gpus) == expected


def test_language_canary_is_one_node_of_the_points_layout():
    point = {
        "id": "x", "nodes": 16, "procs_per_node": 4, "gpus": 64, "tp": 4, "pp": 4, "dp": 4,
        "sequence_parallel": True, "micro_batch": 1, "global_batch": 1536, "iterations": 50,
        "warmup_iterations": 10, "seq_length": 2048, "preset": "gpt3_175b",
        "model_overrides": {"model": {"vocab_size": 50304}},
    }  # fmt: skip
    small = language_canary_point(point, juwels())
    assert (small["nodes"], small["gpus"], small["tp"], small["pp"], small["dp"]) == (1, 4, 4, 1, 1)
    assert small["global_batch"] == 1 and small["iterations"] == 3
    assert small["model_overrides"]["model"]["vocab_size"] == 50304  # kept
    assert small["model_overrides"]["model"]["num_attention_heads"] % small["tp"] == 0


def test_a_canary_runs_on_two_nodes_where_its_jobs_run_on_more_than_one():
    """Data parallel across the two nodes (TP and PP inside one): the rendezvous, the
    network plugin and a gradient all-reduce that leaves the node."""
    from hpcllm.preflight.canary import canary_nodes, train_canary_experiment

    assert [canary_nodes(n) for n in (1, 2, 4, 128)] == [1, 2, 2, 2]
    point = {
        "id": "x", "nodes": 16, "procs_per_node": 4, "gpus": 64, "tp": 4, "pp": 4, "dp": 4,
        "sequence_parallel": True, "micro_batch": 1, "global_batch": 1536, "iterations": 50,
        "warmup_iterations": 10, "seq_length": 2048, "preset": "gpt3_175b",
        "model_overrides": {},
    }  # fmt: skip
    small = language_canary_point(point, juwels(), nodes=2)
    assert (small["nodes"], small["min_nodes"], small["gpus"]) == (2, 2, 8)
    assert (small["tp"], small["pp"], small["dp"], small["global_batch"]) == (4, 1, 2, 2)
    raw = {"preset": "opengptx_800m", "layout": {"nodes": 4, "tp": 2}}
    exp = train_canary_experiment(raw, juwels(), nodes=2)
    assert exp["layout"]["nodes"] == 2 and exp["layout"]["procs_per_node"] == 4
    assert exp["layout"]["tp"] == 2 and exp["batch"] == {"micro": 1, "global": 4}


def test_a_record_made_again_is_said(tmp_path):
    record, image = tmp_path / "canary.json", tmp_path / "a.sif"
    assert rerun_warning(str(record), "k1", None) is None  # a first run
    image.write_text("")
    record.write_text(json.dumps({"key": "k1"}))
    assert rerun_warning(str(record), "k1", str(image)) is None
    assert "what it checks changed" in rerun_warning(str(record), "k2", str(image))
    os.utime(image, (record.stat().st_mtime + 10,) * 2)
    assert "newer than its record" in rerun_warning(str(record), "k1", str(image))
    assert "run the same command again" in rerun_warning(str(record), "k1", str(image))


def test_every_module_the_probe_checks_is_installed_in_the_images():
    """What the jobs import in an image (the probe's list, every purpose, with evaluation)
    is the base image's or a line of envs/requirements.txt, the pip list of every image:
    an evaluation job must not die at start-up for a package no image installs."""
    import re
    from importlib.metadata import packages_distributions

    # the base images' (PyTorch, Transformer Engine, TensorBoard: tests/slurm/standins/
    # image/base), Megatron-LM's checkout, the launcher's module, the bound checkout
    base = {"torch", "torchvision", "transformer_engine", "tensorboard", "megatron", "hpcllm"}
    lines = (Path(ROOT).parents[1] / "envs" / "requirements.txt").read_text().splitlines()
    required = {
        re.split(r"[\[<>=!~; ]", line.strip())[0].lower().replace("_", "-")
        for line in lines
        if line.strip() and not line.startswith("#")
    }
    distributions = packages_distributions()
    for cluster in (juwels(), load_cluster("lumi", root=ROOT)):
        modules = probe.image_modules(cluster, "train", {"megatron", "torch"}, evaluate=True)
        modules += probe.image_modules(cluster, "vision", vision_impls={"torchvision"})
        for top in {m.split(".")[0] for m in modules} - base:
            names = {d.lower().replace("_", "-") for d in distributions.get(top, [top])}
            assert names & required, f"{top} ({names}) is in no line of envs/requirements.txt"


@pytest.mark.parametrize("refused", [None, "sbatch", "scancel"])
def test_slurm_from_the_node_is_an_answer_not_a_failure(tmp_path, monkeypatch, refused):
    """A node that refuses sbatch or scancel passes the check: the record's answer makes
    a chain submitted up front (hpcllm.training.campaign.chain_site), not a failed probe."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, answer in (("sbatch", "echo 81"), ("scontrol", "echo 'pending execution'"),
                         ("scancel", "true")):  # fmt: skip
        body = "echo 'Access/permission denied' >&2; exit 1" if name == refused else answer
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    result = probe.check_slurm_from_node()
    assert result["ok"] and result["allowed"] is (refused is None), result
    if refused:
        assert f"{refused} refused (Access/permission denied)" in result["detail"], result
        assert "submitted up front from the login node" in result["detail"], result


def fake_slurm(tmp_path, monkeypatch) -> Path:
    """sbatch, scontrol and scancel that allow everything; sbatch's arguments are written
    to the file returned. The probe's own job (7) runs in a development partition and QOS."""
    bin_dir, argv = tmp_path / "bin", tmp_path / "sbatch.args"
    bin_dir.mkdir()
    for name, body in (
        ("sbatch", f'echo "$@" > {argv}; echo 81'),
        ("scontrol", 'if [ "$1" = show ]; then echo "JobId=7 Partition=devp Account=acct '
                     'QOS=boost_qos_dbg"; else echo "pending execution"; fi'),
        ("scancel", "true"),
    ):  # fmt: skip
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    return argv


# What the chain's jobs get on the sites that run the pre-flight in a development QOS:
# the profile's train_segment partition and QOS (Leonardo's profile sets none), GPUs and
# cores per task.
CHAIN_JOBS = {
    "leonardo": ("boost_usr_prod", None, "gpu:4", "32"),
    "mn5": ("gpu-p", "acc_x", "gpu:4", "80"),
    "meluxina": ("gpu", "default", "gpu:4", "64"),
}


@pytest.mark.parametrize("name", sorted(CHAIN_JOBS))
def test_the_sbatch_test_asks_for_what_the_chain_jobs_get(tmp_path, monkeypatch, name):
    """The probe's sbatch test submits with the partition, account and QOS the profile
    gives train_segment (whose chain jobs submit their successors), not without a QOS or
    in the probe's own development QOS: a refusal is then about the site's policy."""
    import yaml

    environ = {"HPCLLM_ACCOUNT": "proj0042", "HPCLLM_GPU_PARTITION": "gpu-p",
               "HPCLLM_QOS": "acc_x"}  # fmt: skip
    profile = yaml.safe_load(
        (Path(ROOT).parents[1] / "profiles" / name / "config.yaml").read_text()
    )
    resources = {"default-resources": profile["default-resources"], **profile["set-resources"]}
    cluster = load_cluster(name, root=ROOT, environ=environ)
    submit = probe.submit_options(cluster, resources, environ)
    partition, qos, gres, cpus = CHAIN_JOBS[name]
    assert submit == {
        "partition": partition,
        "account": "proj0042",
        **({"qos": qos} if qos else {}),
        "gres": gres,
        "cpus_per_task": cpus,
    }
    argv = fake_slurm(tmp_path, monkeypatch)
    result = probe.check_slurm_from_node(submit)
    assert result["allowed"], result
    words = argv.read_text().split()
    assert words[words.index("--partition") + 1] == partition
    assert words[words.index("--account") + 1] == "proj0042"
    if qos:
        assert words[words.index("--qos") + 1] == qos
        assert (
            f"--qos {qos} --gres {gres} --cpus-per-task {cpus}: job 81 (held)" in (result["detail"])
        ), result
    else:
        assert "--qos" not in words
    assert words[words.index("--gres") + 1] == gres
    assert words[words.index("--cpus-per-task") + 1] == cpus
    assert "boost_qos_dbg" not in words and "devp" not in words  # the probe's own job's


def gpu_profiles() -> list[str]:
    from hpcllm.clusters import known_clusters

    return [
        n
        for n in known_clusters(ROOT)
        if load_cluster(n, root=ROOT, environ=PROFILE_ENV).gpus_per_node > 0
        and load_cluster(n, root=ROOT, environ=PROFILE_ENV).uses_slurm
    ]


PROFILE_ENV = {"HPCLLM_ACCOUNT": "proj0042", "HPCLLM_GPU_PARTITION": "gpu-p",
               "HPCLLM_QOS": "acc_x"}  # fmt: skip


@pytest.mark.parametrize("name", gpu_profiles())
def test_the_sbatch_test_asks_for_a_gpu_and_cores_on_every_gpu_profile(name):
    """Every GPU profile's probe asks sbatch for what its train_segment asks for: the GPUs
    (--gres, as the profile gives them) and the cores per task, in the partition the chain
    jobs run in. A site that refuses GPU-partition jobs without --gres is then not read as
    "compute nodes may not call sbatch"."""
    import shlex

    import yaml

    profile = yaml.safe_load(
        (Path(ROOT).parents[1] / "profiles" / name / "config.yaml").read_text()
    )
    resources = {"default-resources": profile["default-resources"], **profile["set-resources"]}
    cluster = load_cluster(name, root=ROOT, environ=PROFILE_ENV)
    argv, given = probe.submit_test_argv(probe.submit_options(cluster, resources, PROFILE_ENV))
    own = resources["train_segment"]
    line = shlex.join(argv)
    assert f"--gres {own['gres']}" in line, line
    assert own["gres"] == f"gpu:{cluster.gpus_per_node}", own  # a GPU, the node's all
    assert f"--cpus-per-task {own['cpus_per_task']}" in line, line
    assert "--partition " in line, line
    if name != "rehearsal":  # (the test cluster has no accounts: slurm-no-account)
        assert "--account proj0042" in line, line
    assert "--hold" in argv and argv[argv.index("--nodes") + 1] == "1", line
    assert " ".join(given) in line


def test_the_sbatch_test_takes_the_nodes_gpus_and_cores_where_the_profile_gives_none():
    cluster = load_cluster("juwels", root=ROOT)
    submit = probe.submit_options(cluster, {"default-resources": {"slurm_account": "a"}}, {})
    assert submit == {"partition": cluster.partitions.gpu, "account": "a",
                      "gres": f"gpu:{cluster.gpus_per_node}",
                      "cpus_per_task": str(cluster.cpus_per_node)}  # fmt: skip
    argv, _ = probe.submit_test_argv(submit)
    assert argv[-4:] == ["--gres", "gpu:4", "--cpus-per-task", str(cluster.cpus_per_node)]


def test_without_submit_options_the_sbatch_test_takes_the_probes_own_partition(
    tmp_path, monkeypatch
):
    argv = fake_slurm(tmp_path, monkeypatch)
    assert probe.check_slurm_from_node()["allowed"]
    words = argv.read_text().split()
    assert words[words.index("--partition") + 1] == "devp" and "--qos" not in words


def test_without_a_container_the_runtime_check_passes_and_the_inside_check_runs_here(
    tmp_path,
):
    """A cluster without a container runtime (a workstation, a site's venv): no KeyError
    'none'; the inside check runs this Python with the facts' Megatron-LM checkout first
    on its path."""
    from dataclasses import replace

    local = replace(load_cluster("local", root=ROOT), megatron_lm=str(tmp_path))
    found = probe.check_runtime(local)
    assert found["ok"] and "container_runtime: none" in found["detail"], found
    argv = probe.inside_launch(local, "bare", ["torch"]).argv
    assert argv == [sys.executable, "-m", "hpcllm.preflight.inside", "--sys-path",
                    str(tmp_path), "torch"]  # fmt: skip


def test_the_plan_says_where_the_development_qos_limits_are_not_known():
    """MareNostrum 5's acc_debug and MeluXina's dev have no known limits: the probe and
    the 2-node canaries go there, and the plan says what a job over an unknown limit does
    and which facts to set; Leonardo's known limits, and sites without a QOS, say nothing."""
    import dataclasses

    jobs = {"the site probe": (1, 15), "the canaries": (2, 20)}
    for name in ("mn5", "meluxina"):
        cluster = load_cluster(name, root=ROOT, environ=PROFILE_ENV)
        note = probe.devel_qos_note(cluster, jobs)
        qos = cluster.devel_qos.name
        assert note.startswith(
            f"pre-flight: the site probe (1 node, 15 min), the canaries (2 nodes, 20 min) run "
            f"in the development QOS {qos}, whose limits {cluster.path} does not "
            "know (devel_qos.nodes and devel_qos.max_minutes: null)"
        ), note
        assert "QOSMaxNodePerJobLimit" in note and f"sacctmgr show qos {qos}" in note, note
        # one limit known, the canaries over it: only the probe goes there
        known = dataclasses.replace(cluster.devel_qos, nodes=1)
        note = probe.devel_qos_note(dataclasses.replace(cluster, devel_qos=known), jobs)
        assert "the canaries" not in note and "(devel_qos.max_minutes: null)" in note, note
    assert (
        probe.devel_qos_note(load_cluster("leonardo", root=ROOT, environ=PROFILE_ENV), jobs) is None
    )
    assert probe.devel_qos_note(load_cluster("juwels", root=ROOT), jobs) is None


@pytest.mark.parametrize(
    "wall,minutes",
    [("02:00:00", 120), ("1-00:00:00", 1440), ("00:30:00", 30), ("", None), ("45:00", 45),
     ("00:10:30", 11)],
)  # fmt: skip
def test_maxwall_as_minutes(wall, minutes):
    assert probe._wall_minutes(wall) == minutes


def fake_sacctmgr(tmp_path, monkeypatch, body: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sacctmgr").write_text(f"#!/bin/sh\n{body}\n")
    (bin_dir / "sacctmgr").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


def test_the_development_qos_limits_asked_of_sacctmgr_keep_the_canary_out_of_it(
    tmp_path, monkeypatch
):
    """MareNostrum 5's acc_debug, limits unknown to its file: where sacctmgr says one node
    and 2 h, the probe (1 node) runs in it and the 2-node canaries keep the profile's QOS,
    and the plan says so; where sacctmgr cannot answer, the plan says that the jobs may
    pend behind an unknown limit."""
    cluster = load_cluster("mn5", root=ROOT, environ=PROFILE_ENV)
    jobs = {"the site probe": (1, 15), "the canaries": (2, 20)}
    fake_sacctmgr(tmp_path, monkeypatch, 'echo "acc_debug|cpu=320,node=1|02:00:00"')
    asked = probe.ask_qos_limits("acc_debug")
    limits = asked[0]
    assert (limits.nodes, limits.minutes) == (1, 120), asked
    planned = probe.with_asked_limits(cluster, limits)
    assert planned.devel_qos_for(1, 15) == "acc_debug" and planned.devel_qos_for(2, 20) is None
    note = probe.devel_qos_note(cluster, jobs, asked)
    assert (
        "`sacctmgr -nP show qos acc_debug format=Name,MaxTRESPerJob,MaxWall` says 1 node(s) "
        "and 120 min per job: the site probe (1 node, 15 min) in it, the canaries (2 nodes, "
        "20 min) in the profile's QOS"
    ) in note, note
    # no per-job limits listed: both fit
    fake_sacctmgr(tmp_path, monkeypatch, 'echo "acc_debug||"')
    asked = probe.ask_qos_limits("acc_debug")
    note = probe.devel_qos_note(cluster, jobs, asked)
    assert "says any number of nodes and no time limit per job: the site probe" in note, note
    assert "no job in the profile's QOS" in note, note
    # sacctmgr cannot answer (no accounting database, not on PATH): said, the QOS kept
    fake_sacctmgr(tmp_path, monkeypatch, 'echo "sacctmgr: error: no slurmdbd" >&2; exit 1')
    asked = probe.ask_qos_limits("acc_debug")
    assert asked[0] is None and "failed (1: sacctmgr: error: no slurmdbd)" in asked[1], asked
    assert probe.with_asked_limits(cluster, asked[0]) is cluster
    note = probe.devel_qos_note(cluster, jobs, asked)
    assert "the canaries (2 nodes, 20 min) run in the development QOS acc_debug" in note
    assert "failed (1: sacctmgr: error: no slurmdbd)" in note and "PENDING" in note, note
    fake_sacctmgr(tmp_path, monkeypatch, "true")
    assert "lists no QOS acc_debug" in probe.ask_qos_limits("acc_debug")[1]
