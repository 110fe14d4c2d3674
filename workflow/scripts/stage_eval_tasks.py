import os

import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm import logs
from hpcllm.evaluation import run

# A login-node rule: it downloads the tasks where the site allows, so it stays online.
logs.setup(snakemake.log[0])
params = snakemake.params
run.stage_tasks(
    snakemake.wildcards.experiment,
    params.tasks,
    params.tasks_dir,
    os.environ.get("HPCLLM_HF_MIRROR"),
    online=params.online,
    site=params.site,
    facts=params.facts,
    manifest=snakemake.output.manifest,
)
