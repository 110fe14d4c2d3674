"""A site's first run of a campaign leaves a chain in the queue (issue 47): the dry run of
the 800M example (config/examples/fineweb_juwels.yaml with
config/experiments/opengptx_800m.yaml, as its header says to run it) on every cluster
profile, before any site probe ran, plans a chain and says how it is submitted: by the
site probe's answer (it runs before the first segment), or by the cluster fact
slurm_from_compute_nodes, named with its file. Where the pre-flight goes to a development
QOS whose limits are not known (MareNostrum 5, MeluXina), the plan says so."""

from __future__ import annotations

import re

import pytest
from support import REPO, hang_guard, make_workdir, run_snakemake
from test_profiles import (  # noqa: F401  (no_slurm: a fixture)
    PROFILES,
    USER_ENV,
    copy_images_in,
    no_slurm,
    planned_jobs,
)

from hpcllm.clusters import load_cluster

EXAMPLE = ("config/examples/fineweb_juwels.yaml", "config/experiments/opengptx_800m.yaml")


def plan_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("training: ")]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.workflow
@pytest.mark.parametrize("name", PROFILES)
def test_the_first_dry_run_of_the_800m_example_plans_a_chain(name, tmp_path, no_slurm):  # noqa: F811
    workdir = make_workdir(tmp_path / "work")
    copy_images_in(name, workdir)
    env = {**no_slurm, **USER_ENV}
    cluster = load_cluster(name, REPO / "config" / "clusters", environ=USER_ENV)
    if not cluster.internet.login:  # the user copies FineWeb in first, as the plan says
        (tmp_path / "mirror/HuggingFaceFW/fineweb").mkdir(parents=True)
        env["HPCLLM_HF_MIRROR"] = str(tmp_path / "mirror")
    args = ["-n", "--profile", f"profiles/{name}", "--configfile", *EXAMPLE]
    proc = run_snakemake(workdir, *args, env=env, examples=False, timeout=hang_guard(30))
    out = proc.stdout + proc.stderr
    assert not (workdir / "results/preflight").exists()  # the first run: no probe record
    line = plan_line(out)
    facts = f"config/clusters/{name}.yaml"  # as the workflow names it
    fact = cluster.slurm_from_compute_nodes
    if fact is False:  # the site's documented answer: the chain up front, named with its file
        assert "submitted up front from the login node by default" in line, line
        assert f"{facts}: slurm_from_compute_nodes" in line, line
    elif fact is True:
        assert "runs as a chain of Slurm jobs by default, each submitting its successor" in line
        assert f"{facts}: slurm_from_compute_nodes" in line, line
    else:  # the probe, planned before the first segment, decides how it is submitted
        assert line.startswith(
            "training: each experiment runs as a chain of Slurm jobs by default, in Slurm "
            "without the login node"
        ), line
        assert "site_probe" in {rule for rule, _ in planned_jobs(out)}, out[-3000:]
    # The line comes from the flag that makes train_segment the chain's login-node rule
    # (CHAINED, workflow/rules/training_functions.smk; a dry run does not print that);
    # each segment waits for the canary, which waits for the probe.
    canary = f"results/preflight/{name}/canary/train_megatron.json"
    inputs = re.findall(r"^rule train_segment:\n\s+input: (.*)$", out, re.M)
    assert len(inputs) == 10 and all(canary in line.split(", ") for line in inputs), inputs
    assert "one Slurm job per segment" not in out
    # the chain's jobs are priced as the segment jobs they are (workflow/rules/cost.smk)
    assert re.search(r"\n  train_segment: 10 job\(s\), [\d.,]+ node-hours", out), out[-3000:]
    # Pre-flight jobs sent to a development QOS whose limits are not known: said
    qos = cluster.devel_qos
    unknown = qos is not None and None in (qos.nodes, qos.max_minutes)
    if unknown:
        said = f"in the development QOS {qos.name}, whose limits {facts} does not know"
        assert said in out, out[:3000]
    else:
        assert "whose limits" not in out, out[:3000]
