"""Pre-flight in the plan (workflow/rules/preflight.smk): on a GPU cluster the GPU jobs wait
for their canary, which waits for the site probe of its image, both on the devel
partition and in the cost lines; on the laptop profile there is neither."""

from __future__ import annotations

import json
import re

import pytest
from support import make_workdir, run_snakemake
from test_profiles import OPT_IN, USER_ENV, no_slurm  # noqa: F401  (fixture)

pytestmark = pytest.mark.workflow


def test_juwels_plans_probe_and_canary_before_the_segments(tmp_path, no_slurm):  # noqa: F811
    workdir = make_workdir(tmp_path / "work")
    out = run_snakemake(
        workdir, "-n", "-F", "--profile", "profiles/juwels", "--configfile", *OPT_IN,
        env={**no_slurm, **USER_ENV},
    )  # fmt: skip
    text = out.stdout + out.stderr
    blocks = {m.group(1): m.group(0) for m in re.finditer(r"rule (\w+):\n(?:    .*\n)+", text)}
    probe, canary, segment = blocks["site_probe"], blocks["canary"], blocks["train_segment"]
    # devel nodes with the GPUs and the node of train_segment's profile resources: one
    # for the probe, two for the canary of the 4-node segments (a rendezvous and an
    # all-reduce across nodes)
    for block, nodes in ((probe, 1), (canary, 2)):
        assert "slurm_partition=develbooster" in block and f"nodes={nodes}," in block, block
        assert f"tasks={nodes}," in block, block
        assert "gres=gpu:4" in block and "cpus_per_task=48" in block, block
    assert "results/preflight/juwels/probe/megatron-nvidia.json" in canary
    assert "kind=train_megatron" in canary
    assert "results/preflight/juwels/canary/train_megatron.json" in segment
    # priced with the other jobs that hold GPU nodes
    for rule in ("site_probe", "canary"):
        assert re.search(rf"\n  {rule}: 1 job\(s\), [\d.]+ node-hours", text), text[-3000:]


def test_the_laptop_plan_has_no_preflight(tmp_path):
    out = run_snakemake(make_workdir(tmp_path / "work"), "-n", "-F", "--profile", "profiles/local")
    text = out.stdout + out.stderr
    assert "train_segment" in text
    assert "site_probe" not in text and "canary" not in text and "preflight" not in text


def test_the_plan_warns_where_the_probed_torchrun_cuts_the_signal_lead(tmp_path, no_slurm):  # noqa: F811
    """The probe found the image's torchrun without --shutdown-timeout: the plan says that
    the 800M segments' 600 s lead after SIGTERM is cut to 30 s there."""
    workdir = make_workdir(tmp_path / "work")
    record = workdir / "results/preflight/juwels/probe/megatron-nvidia.json"
    record.parent.mkdir(parents=True)
    inside = {"torch": "2.6.0", "torchrun_shutdown_timeout": False}
    record.write_text(json.dumps({"image": "megatron-nvidia", "job_id": "7", "inside": inside}))
    out = run_snakemake(
        workdir, "-n", "--profile", "profiles/juwels", "--configfile", *OPT_IN,
        env={**no_slurm, **USER_ENV},
    )  # fmt: skip
    text = " ".join((out.stdout + out.stderr).split())
    assert "the site probe found torch 2.6.0 in megatron-nvidia" in text, text[-3000:]
    assert "opengptx_800m (600 s)" in text  # its time.signal_seconds
    # the fallback before the limit is SIGUSR2, whose lead the plan states
    assert (
        "opengptx_800m: Slurm's --signal=USR2 comes time.signal_seconds = 600 s before the "
        "time limit (no checkpoint save measured yet)" in text
    ), text[-3000:]


@pytest.mark.parametrize(
    "allowed,chain,words",
    [
        (True, None, "a chain of Slurm jobs by default, each submitting its successor "
                           "(compute nodes may call sbatch: the site probe, job 7"),
        (False, None, "submitted up front from the login node by default (compute nodes "
                             "may not call sbatch: the site probe, job 7"),
        (False, True, "submitted up front from the login node (compute nodes may not "
                            "call sbatch: the site probe, job 7"),
    ],
)  # fmt: skip
def test_the_probes_answer_decides_the_chain(tmp_path, no_slurm, allowed, chain, words):  # noqa: F811
    """training.chain unset or true: the chain, each job submitting its successor where
    the probe found that compute nodes may call sbatch, else submitted up front."""
    workdir = make_workdir(tmp_path / "work")
    record = workdir / "results/preflight/juwels/probe/megatron-nvidia.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"image": "megatron-nvidia", "job_id": "7",
                                  "slurm_from_compute_node": allowed}))  # fmt: skip
    configs = list(OPT_IN)
    if chain is not None:
        (workdir / "chain.yaml").write_text(f"training: {{chain: {str(chain).lower()}}}\n")
        configs.append(str(workdir / "chain.yaml"))
    out = run_snakemake(
        workdir, "-n", "-F", "--profile", "profiles/juwels", "--configfile", *configs,
        env={**no_slurm, **USER_ENV},
    )  # fmt: skip
    text = out.stdout + out.stderr
    # (the dry run lists train_segment either way: the chain's rule runs on the login node)
    assert words in " ".join(text.split()), text[-3000:]
    assert text.count("rule train_segment:") == 10
