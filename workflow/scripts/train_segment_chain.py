# train_segment with training.chain on a Slurm run (a login-node job): submit the
# experiment's chain of Slurm jobs, or reattach to the one in Slurm, and wait until this
# segment is committed (hpcllm.training.campaign.chain, docs/training.md).
import json
import logging
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

import hpcllm
from hpcllm import logs
from hpcllm.training.campaign import chain_site
from hpcllm.training.campaign.chain import (
    Campaign,
    ChainError,
    ChainStopped,
    sbatch_geometry,
    wait_for_segment,
)
from hpcllm.training.plan.experiment import as_measured

logs.setup(snakemake.log.main)
settings = SimpleNamespace(**json.loads(os.environ.get("HPCLLM_CHAIN_SLURM_SETTINGS", "{}")))
resources = {k: v for k, v in dict(snakemake.resources).items() if not k.startswith("_")}
source = str(Path(hpcllm.__file__).resolve().parents[1])  # the checkout's src/
container = snakemake.input.container[0] if snakemake.input.container else None
# Up front from here where the site probe (run before the segments) found that compute
# nodes may not call sbatch (hpcllm.training.campaign.chain_site).
answer = chain_site.site_answer(
    snakemake.params.cluster, chain_site.probe_record_path(snakemake.params.cluster, container)
)
campaign = Campaign(
    name=snakemake.wildcards.experiment,
    # layout: auto: the measuring job's choice (planned before it ran: again)
    prepared=as_measured(
        snakemake.wildcards.experiment,
        snakemake.params.prepared,
        snakemake.config,
        snakemake.params.cluster,
    ),
    cluster=snakemake.params.cluster,
    workdir=os.getcwd(),
    container=container,
    sbatch=sbatch_geometry(resources, snakemake.threads, settings),
    max_attempts=snakemake.config["training"]["max_attempts"],
    up_front=chain_site.up_front(answer),
    python=sys.executable,
    environment={
        "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))
    },
)
# What it finds and waits for goes to the terminal too (hpcllm.progress), the stop as one line.
say = logging.getLogger("hpcllm.progress")
try:
    poll = snakemake.params.cluster.squeue_poll_seconds
    wait_for_segment(campaign, int(snakemake.wildcards.k), poll_seconds=poll, say=say.info)
except (ChainStopped, ChainError) as e:  # a stop, or the campaign file unreadable
    say.error("%s", e)
    sys.exit(1)
