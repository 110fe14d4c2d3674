"""Cluster facts: every file loads, unknown names and bad keys give clear errors."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from hpcllm.clusters import (
    ClusterError,
    known_clusters,
    load_cluster,
    plan_errors,
    profile_errors,
    profile_resource,
)

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "config" / "clusters"
ISSUE_CLUSTERS = {
    "juwels", "jureca", "jupiter", "jedi", "lumi", "leonardo", "mn5",
    "meluxina", "karolina", "vega", "deucalion", "discoverer", "local",
}  # fmt: skip
# Every "must set" variable, so that files with unknown facts load completely.
ALL_SET = {
    "HPCLLM_GPU_PARTITION": "gpu-p",
    "HPCLLM_CPU_PARTITION": "cpu-p",
    "HPCLLM_DEVEL_PARTITION": "devel-p",
}


def test_every_cluster_of_the_issue_has_a_facts_file():
    assert ISSUE_CLUSTERS <= set(known_clusters(ROOT))


@pytest.mark.parametrize("name", sorted(ISSUE_CLUSTERS))
def test_facts_load_and_are_consistent(name):
    c = load_cluster(name, ROOT, environ=ALL_SET)
    assert c.name == name and plan_errors(c) == []
    if name == "local":
        assert (c.scheduler, c.gpus_per_node, c.container_runtime) == ("none", 0, "none")
        return
    assert c.uses_slurm and c.gpus_per_node in (4, 8) and c.gpu is not None
    assert c.partitions.gpu, "every GPU cluster has a GPU partition"
    # where CPU-only jobs hold GPU nodes, the file says why, for the plan
    assert bool(c.no_cpu_partition) == c.whole_nodes, name
    assert c.gpu.peak_bf16_tflops > c.gpu.peak_fp32_tflops
    # Caches go to the project's scratch, never to $HOME.
    for var in ("HF_HOME", "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME"):
        assert c.env[var].startswith(c.scratch) and "HOME" not in c.env[var]


def test_site_specifics_from_the_issue():
    juwels = load_cluster("juwels", ROOT)
    assert juwels.launcher == "torchrun_jsc" and juwels.rendezvous_suffix == "i"
    for key, value in {
        "NCCL_SOCKET_IFNAME": "ib0",
        "GLOO_SOCKET_IFNAME": "ib0",
        "NCCL_IB_TIMEOUT": "50",
        "UCX_RC_TIMEOUT": "4s",
        "NCCL_IB_RETRY_CNT": "10",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "SRUN_CPUS_PER_TASK": "$SLURM_CPUS_PER_TASK",
    }.items():
        assert juwels.env[key] == value
    assert juwels.env_outside_container == {"PMIX_SECURITY_MODE": "native"}
    for jsc in ("jureca", "jupiter", "jedi"):
        assert load_cluster(jsc, ROOT, environ=ALL_SET).launcher == "torchrun_jsc"
    leonardo = load_cluster("leonardo", ROOT)
    assert leonardo.env["NCCL_PXN_DISABLE"] == "1" and leonardo.launcher == "torchrun"
    lumi = load_cluster("lumi", ROOT)
    assert (lumi.gpu.vendor, lumi.gpus_per_node, lumi.container_runtime) == (
        "amd",
        8,
        "singularity",
    )


def test_cost_is_counted_in_each_sites_billing_unit():
    """LUMI bills 4 GPU-hours per standard-g node-hour (a GPU-hour is an MI250X module of
    2 GCDs, its billing policy), not the 8 GCDs ROCm shows; elsewhere a GPU is a GPU."""
    from hpcllm.plan_cost import Job, cost_per_rule

    lumi = load_cluster("lumi", ROOT)
    assert lumi.gpus_per_node == 8 and lumi.billed_gpus_per_node == 4
    (cost,) = cost_per_rule([Job("train_segment", 4, 600)], lumi.billed_gpus_per_node)
    assert (cost.node_hours, cost.gpu_hours) == (40, 160)
    for name, per_node in (("juwels", 4), ("karolina", 8)):
        assert load_cluster(name, ROOT, environ=ALL_SET).billed_gpus_per_node == per_node
    assert "docs.lumi-supercomputer.eu/runjobs/lumi_env/billing" in (ROOT / "lumi.yaml").read_text()


@pytest.mark.parametrize("name", sorted(ISSUE_CLUSTERS - {"local"}))
def test_collectives_cannot_fall_back_to_tcp_silently(name):
    """NCCL (RCCL) falls back to TCP sockets when its network (the InfiniBand transport,
    LUMI's libfabric plugin) does not load; NCCL_NET names it, so that the job stops at
    start-up instead of training at a fraction of the speed."""
    from hpcllm.launch import build_launch

    c = load_cluster(name, ROOT, environ=ALL_SET)
    header = (ROOT / f"{name}.yaml").read_text().split("\ndescription:")[0]
    expected = "AWS Libfabric" if "Slingshot" in header else "IB"
    assert c.env.get("NCCL_NET") == expected, name
    script = build_launch(c, nodes=2, procs_per_node=c.gpus_per_node, command=["python"]).shell()
    assert f"export NCCL_NET={shlex.quote(expected)}\n" in script


@pytest.mark.parametrize("name", sorted(ISSUE_CLUSTERS - {"local"}))
def test_benchmark_points_get_the_time_limit_of_their_work(name):
    """No GPU profile pins a benchmark rule's runtime (a constant 60 minutes ended the
    1-node FP32 vision points and billed the large ones for time they never use); the
    rules size it from each point's work (hpcllm.bench.sweeps.point_time_limit)."""
    profile = yaml.safe_load((REPO / "profiles" / name / "config.yaml").read_text())
    for rule in ("bench_language", "bench_vision", "train_segment"):
        assert "runtime" not in profile["set-resources"].get(rule, {}), (name, rule)


def test_unknown_cluster_lists_the_known_ones():
    with pytest.raises(ClusterError, match="unknown cluster 'juwles'.*Known clusters: .*juwels"):
        load_cluster("juwles", ROOT)
    with pytest.raises(ClusterError, match="unknown cluster"):
        load_cluster("../config", ROOT)


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "site.yaml").write_text(text)
    return tmp_path


LOCAL = (ROOT / "local.yaml").read_text()


def test_a_bad_key_names_the_file_and_the_key(tmp_path):
    write(tmp_path, LOCAL + "gpus_per_nod: 4\n")
    with pytest.raises(
        ClusterError, match=r"(?s)site.yaml is not a valid.*gpus_per_nod. was unexpected"
    ):
        load_cluster("site", tmp_path)
    write(tmp_path, LOCAL.replace("container_runtime: none", "container_runtime: docker"))
    with pytest.raises(ClusterError, match=r"container_runtime: 'docker' is not one of"):
        load_cluster("site", tmp_path)
    write(tmp_path, LOCAL.replace("gpus_per_node: 0", "gpus_per_node: 4"))
    with pytest.raises(ClusterError, match="gpus_per_node is 4 but `gpu:`"):
        load_cluster("site", tmp_path)
    write(tmp_path, "description: [unclosed\n")
    with pytest.raises(ClusterError, match="not valid YAML"):
        load_cluster("site", tmp_path)


def test_a_cache_the_cluster_sets_itself_stays_where_it_says(tmp_path):
    """Caches go under the scratch space unless the cluster's env sets them itself."""
    c = load_cluster("local", ROOT)
    assert c.env["HF_HOME"] == c.scratch.rstrip("/") + "/hpcllm-cache/huggingface"
    import yaml

    raw = yaml.safe_load(LOCAL)
    raw.setdefault("env", {})["HF_HOME"] = "/site/shared/hf"
    write(tmp_path, yaml.safe_dump(raw))
    c = load_cluster("site", tmp_path)
    assert c.env["HF_HOME"] == "/site/shared/hf"
    assert c.env["TRITON_CACHE_DIR"] == c.scratch.rstrip("/") + "/hpcllm-cache/triton"


def test_partitions_not_known_for_sure_come_from_the_environment():
    c = load_cluster("deucalion", ROOT, environ={"HPCLLM_GPU_PARTITION": "gpu-x"})
    assert c.partitions.gpu == "gpu-x" and c.partitions.cpu is None
    errors = plan_errors(c)
    assert len(errors) == 2
    assert "partitions.cpu" in errors[0] and "export HPCLLM_CPU_PARTITION=" in errors[0]
    assert "deucalion.yaml" in errors[0]


# Sites where development is a QOS, not a partition: (name, nodes, minutes) of devel_qos.
DEVEL_QOS = {
    "leonardo": ("boost_qos_dbg", 2, 30),
    "mn5": ("acc_debug", None, None),
    "meluxina": ("dev", None, None),
}


@pytest.mark.parametrize("name", sorted(DEVEL_QOS))
def test_development_is_a_qos_stated_with_its_source(name):
    """The pre-flight's development QOS is a fact of the cluster file: its source beside
    it, and NOT KNOWN FOR SURE where the site's limits could not be read."""
    c = load_cluster(name, ROOT, environ=ALL_SET)
    assert c.partitions.devel is None
    assert (c.devel_qos.name, c.devel_qos.nodes, c.devel_qos.max_minutes) == DEVEL_QOS[name]
    text = (ROOT / f"{name}.yaml").read_text()
    comment = text[text.index("# devel_qos:") : text.index("\ndevel_qos:")]
    assert "https://" in comment or "NOT KNOWN FOR SURE" in comment, comment
    if None in DEVEL_QOS[name][1:]:
        assert "NOT KNOWN FOR SURE: its limits" in comment, comment


def test_a_preflight_job_beyond_the_development_qos_limits_keeps_the_profiles_qos():
    """The probe (one node, 15 minutes) and a canary (two nodes, 20 minutes) fit
    Leonardo's boost_qos_dbg (2 nodes, 30 minutes); a longer or larger job would be
    refused there, so it gets none."""
    from hpcllm.preflight import canary, probe

    leonardo = load_cluster("leonardo", ROOT)
    assert leonardo.devel_qos_for(1, probe.RUNTIME_MIN) == "boost_qos_dbg"
    assert leonardo.devel_qos_for(2, canary.RUNTIME_MIN) == "boost_qos_dbg"
    assert leonardo.devel_qos_for(1, 31) is None and leonardo.devel_qos_for(3, 10) is None
    # Limits not known for sure: the pre-flight's one-node jobs are put there.
    assert load_cluster("meluxina", ROOT).devel_qos_for(1, canary.RUNTIME_MIN) == "dev"
    assert load_cluster("juwels", ROOT).devel_qos_for(1, 5) is None  # a devel partition


def test_a_development_qos_states_its_limits(tmp_path):
    write(tmp_path, LOCAL + "devel_qos: {name: dbg}\n")
    with pytest.raises(ClusterError, match=r"devel_qos: 'nodes' is a required property"):
        load_cluster("site", tmp_path)
    write(tmp_path, LOCAL + "devel_qos: {name: 'a b', nodes: 1, max_minutes: null}\n")
    with pytest.raises(ClusterError, match=r"devel_qos.name: 'a b' does not match"):
        load_cluster("site", tmp_path)
    write(tmp_path, LOCAL + "devel_qos: {name: dbg, nodes: 1, max_minutes: null}\n")
    assert load_cluster("site", tmp_path).devel_qos_for(1, 600) == "dbg"


def test_a_profile_resource_is_read_as_snakemake_reads_it():
    """The rule's set-resources, else default-resources; variables expanded, a Python
    literal read as one."""
    resources = {
        "default-resources": {"slurm_account": "$ACC", "qos": "default", "mem_mb": 1000},
        "train_segment": {"qos": "'${Q}'"},
    }
    environ = {"ACC": "p1", "Q": "acc_x"}
    assert profile_resource(resources, "train_segment", "qos", environ) == "acc_x"
    assert profile_resource(resources, "train_segment", "slurm_account", environ) == "p1"
    assert profile_resource(resources, "canary", "qos", environ) == "default"
    assert profile_resource(resources, "canary", "mem_mb", environ) == 1000
    assert profile_resource(resources, "train_segment", "constraint", environ) is None


def test_profile_values_naming_unset_variables_are_reported():
    resources = {
        "default-resources": {"slurm_account": "$HPCLLM_ACCOUNT", "mem_mb": 1000},
        "train_segment": {"slurm_partition": "${PART}", "qos": "fixed"},
    }
    errors = profile_errors(resources, environ={"HPCLLM_ACCOUNT": ""})
    assert len(errors) == 2
    assert "default-resources takes slurm_account from $HPCLLM_ACCOUNT" in errors[0]
    # One command per pair of backticks (none nested in another).
    assert errors[0].endswith(
        "`export HPCLLM_ACCOUNT=<your project's compute-time account>` before running "
        "snakemake (find it with `sacctmgr show assoc user=$USER`)"
    )
    assert "rule train_segment takes slurm_partition from $PART" in errors[1]
    assert profile_errors(resources, environ={"HPCLLM_ACCOUNT": "a", "PART": "p"}) == []


# What Apptainer/Singularity bind by default (system config), so a job sees them anyway.
DEFAULT_BINDS = ("/tmp", "/dev", "$HOME")


@pytest.mark.parametrize("name", known_clusters(ROOT))
def test_scratch_and_node_local_space_are_bound_into_the_container(name):
    c = load_cluster(name, ROOT, environ=ALL_SET)
    if not c.uses_containers:
        return
    for what, path in (("scratch", c.scratch), ("local_storage", c.local_storage)):
        if not path or path.startswith(DEFAULT_BINDS):
            continue
        assert any(path == b or path.startswith(b.rstrip("/") + "/") for b in c.container_binds), (
            f"{name}: {what} {path} is not under a container bind {c.container_binds}"
        )


def test_rccl_in_the_lumi_image_reaches_the_hosts_libfabric():
    """The plugin folder alone on LD_LIBRARY_PATH left RCCL without the CXI libfabric."""
    lumi = load_cluster("lumi", ROOT, environ=ALL_SET)
    recipe = (REPO / "envs" / "megatron-rocm.def").read_text()
    plugin = re.search(r"LD_LIBRARY_PATH=(/opt/aws-ofi-rccl/lib):", recipe).group(1)
    inside = lumi.env["SINGULARITYENV_LD_LIBRARY_PATH"].split(":")
    assert inside[0] == plugin  # replaces the image's own value, so it keeps the plugin
    # the host's libfabric, bound, its version folder found when the job starts
    (variable,) = [d[1:] for d in inside if d.startswith("$")]
    pattern = lumi.env_globs[variable]
    assert "libfabric/*/" in pattern and not re.search(r"/\d+\.\d+", pattern)
    assert any(pattern.startswith(b + "/") for b in lumi.container_binds)
    assert "/usr/lib64/libcxi.so.1" in lumi.container_binds and "/usr/lib64" in inside


def test_the_cluster_is_read_from_the_profile_a_command_line_config_replaced(tmp_path):
    """Snakemake replaces a profile's `config:` by the command line's --config: the
    workflow reads the cluster from the profile named on the command line (or in
    $SNAKEMAKE_PROFILE) and refuses a --config cluster= that names another."""
    from hpcllm.clusters import cluster_from_profile, profile_cluster

    folder = tmp_path / "profiles" / "juwels"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("executor: slurm\nconfig:\n  cluster: juwels\n")
    roots = [str(tmp_path)]
    argv = ["snakemake", "-n", "--profile", "profiles/juwels", "--config", "max_gpu_hours=9"]
    found = profile_cluster(argv, environ={}, roots=roots)
    assert found.cluster == "juwels" and found.command_line_cluster is None
    name, note = cluster_from_profile("local", found)
    assert name == "juwels" and "cluster: juwels (from " in note
    assert cluster_from_profile("juwels", found) == ("juwels", None)
    # --profile=..., and the profile from the environment
    assert profile_cluster(["--profile=profiles/juwels"], {}, roots).cluster == "juwels"
    env = {"SNAKEMAKE_PROFILE": "profiles/juwels"}
    assert profile_cluster(["-n"], env, roots).cluster == "juwels"
    assert profile_cluster(["-n"], {}, roots) is None
    # a command line that names another cluster than its profile
    argv = ["--profile", "profiles/juwels", "--config", "cluster=local", "max_gpu_hours=9"]
    found = profile_cluster(argv, environ={}, roots=roots)
    assert found.command_line_cluster == "local"
    with pytest.raises(ClusterError, match="--config cluster=local on the command line, but"):
        cluster_from_profile("local", found)


def test_a_key_given_twice_in_a_facts_file_is_refused_naming_it_and_its_lines(tmp_path):
    """PyYAML keeps the last of two equal keys without a word: a fact would be lost."""
    twice = LOCAL.replace("scratch: .cache\n", "scratch: .cache\nenv: {A: '1'}\n")
    write(tmp_path, twice)
    lines = twice.splitlines()
    first, second = [i + 1 for i, line in enumerate(lines) if line.startswith("env:")]
    with pytest.raises(ClusterError) as error:
        load_cluster("site", tmp_path)
    assert str(error.value) == (
        f"{tmp_path / 'site.yaml'}: a key given twice (YAML keeps only the last, so a fact "
        f"would be silently lost); keep one of each:\n  env (lines {first} and {second})"
    )
    write(tmp_path, LOCAL.replace("{login: true,", "{login: true, login: false,"))
    with pytest.raises(ClusterError, match=r"internet.login \(lines \d+ and \d+\)"):
        load_cluster("site", tmp_path)


def test_a_gpu_section_with_no_gpus_per_node_is_refused_naming_both_lines(tmp_path):
    juwels = (ROOT / "juwels.yaml").read_text()
    text = re.sub(r"(?m)^gpus_per_node: \d+", "gpus_per_node: 0", juwels)
    write(tmp_path, text)
    lines = text.splitlines()
    at = {k: next(i + 1 for i, s in enumerate(lines) if s.startswith(k)) for k in ("gpus_", "gpu:")}
    with pytest.raises(ClusterError) as error:
        load_cluster("site", tmp_path)
    assert str(error.value) == (
        f"{tmp_path / 'site.yaml'}:{at['gpus_']}: gpus_per_node is 0, but the file has a "
        f"`gpu:` section (A100-SXM4-40GB, line {at['gpu:']}): set gpus_per_node to the GPUs (AMD: "
        "GCDs) per node, or `gpu: null` for a cluster without GPUs"
    )


def test_account_and_partition_values_slurm_would_not_take_as_given_are_refused():
    """The Slurm plugin splits an account at whitespace and commas and submits the first
    part: `proj1\\nproj2` ran as proj1."""
    resources = {
        "default-resources": {"slurm_account": "$HPCLLM_ACCOUNT", "slurm_partition": "booster"},
        "train_segment": {"slurm_partition": "${PART}"},
        "tokenize": {"slurm_partition": "gpu nodes", "slurm_account": 12345},
    }
    environ = {"HPCLLM_ACCOUNT": "proj1\nproj2", "PART": "gpu,gpu-big"}
    errors = profile_errors(resources, environ=environ)
    assert errors == [
        "the profile's default-resources takes slurm_account from $HPCLLM_ACCOUNT, which is "
        "'proj1\\nproj2': an account is one name of letters, digits and _ . + -, without "
        "'\\n'; `export HPCLLM_ACCOUNT=<your project's compute-time account>` (find it with "
        "`sacctmgr show assoc user=$USER`)",
        "the profile's set-resources of rule tokenize takes slurm_partition, which is 'gpu "
        "nodes': partitions are names (a list: commas) of letters, digits and _ . + -, "
        "without ' '; set slurm_partition in the profile to the partition's name (find it "
        "with `sinfo -s`)",
    ]
    assert profile_errors(resources, environ={**environ, "HPCLLM_ACCOUNT": "p,q"})[0].endswith(
        "without ','; `export HPCLLM_ACCOUNT=<your project's compute-time account>` (find it "
        "with `sacctmgr show assoc user=$USER`)"
    )
    # As Snakemake reads a resource: a Python expression where it is one (JEDI's "'all'")
    fine = {**resources, "tokenize": {"slurm_partition": "'all'"}}
    assert profile_errors(fine, environ={**environ, "HPCLLM_ACCOUNT": " proj1\n"}) == []


def test_a_configfile_naming_another_cluster_than_its_profile_is_refused(tmp_path):
    """The profile's `config: cluster:` wins over a --configfile: the file's cluster was
    silently ignored."""
    from hpcllm.clusters import check_configfile_cluster, profile_cluster

    folder = tmp_path / "profiles" / "juwels"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("executor: slurm\nconfig:\n  cluster: juwels\n")
    (tmp_path / "lumi.yaml").write_text("cluster: lumi\nmax_gpu_hours: 9\n")
    (tmp_path / "juwels.yaml").write_text("cluster: juwels\n")
    (tmp_path / "plain.yaml").write_text("max_gpu_hours: 9\n")
    roots = [str(tmp_path)]
    found = profile_cluster(["--profile", "profiles/juwels"], environ={}, roots=roots)
    with pytest.raises(ClusterError) as error:
        check_configfile_cluster(["plain.yaml", "lumi.yaml"], found, roots)
    assert str(error.value) == (
        f"lumi.yaml sets cluster: lumi, but the profile {folder / 'config.yaml'} is for "
        "cluster 'juwels' (its resources, partitions and account), and a profile's `config: "
        "cluster:` wins over a --configfile: the plan would be made for juwels. Use "
        "--profile profiles/lumi to run on lumi, or remove `cluster: lumi` from lumi.yaml "
        "to run on juwels."
    )
    # the last file naming a cluster counts, as in Snakemake's merge
    check_configfile_cluster(["lumi.yaml", "juwels.yaml", "plain.yaml"], found, roots)
    check_configfile_cluster([str(tmp_path / "plain.yaml")], found, roots)
    check_configfile_cluster(["lumi.yaml"], None, roots)  # no profile: the file decides
