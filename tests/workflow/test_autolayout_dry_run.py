"""layout: auto through Snakemake's plan on LUMI: the 800M example of the docs with
``layout: {nodes: 4, auto: true}`` (the review's case: the plan refused its own pick,
"TP=1 PP=1 DP=32 needs about 102.4 GB per GPU"). The pick is planned as the job runs
there (no Transformer Engine) and the measuring job is planned on 2 of the 4 nodes."""

from __future__ import annotations

import re

import yaml
from support import hang_guard, make_workdir, run_snakemake

USER_ENV = {"HPCLLM_ACCOUNT": "myproject"}


def test_lumi_plans_the_800m_examples_auto_layout(tmp_path):
    workdir = make_workdir(tmp_path / "work")
    auto = {"training": {"experiments": {"opengptx_800m": {"layout": {"nodes": 4, "auto": True}}}}}
    (workdir / "auto.yaml").write_text(yaml.safe_dump(auto))
    args = ["-n", "--profile", "profiles/lumi", "--configfile"]
    args += ["config/examples/fineweb_juwels.yaml", "config/experiments/opengptx_800m.yaml"]
    proc = run_snakemake(
        workdir, *args, "auto.yaml", env=USER_ENV, examples=False, timeout=hang_guard(120)
    )
    out = proc.stdout + proc.stderr
    assert "needs about" not in out and "try recompute" not in out
    table = out.split("opengptx_800m: layout: auto, ", 1)[1]
    assert table.startswith("85 layouts fit; the measuring job runs the best 3 on 2 node(s)")
    chosen = next(line for line in table.splitlines() if line.rstrip().endswith("<-"))
    # the table's memory is the plan's figure of the job as it runs on LUMI
    memory = re.search(r"(\d+\.\d+)GB", chosen).group(1)
    assert f"planned at {float(memory):.1f} GB per GPU" in out
    assert re.search(r"rule measure_layout:\n(?:    .*\n)*?    resources: .*\bnodes=2,", out)
