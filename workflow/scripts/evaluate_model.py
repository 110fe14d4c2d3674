import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm.launch import go_offline

rule = snakemake.rule
if rule != "stage_eval_tasks":  # the login-node rule downloads where the site allows
    go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)

import os

from hpcllm import logs
from hpcllm.evaluation import run
from hpcllm.evaluation.table import write_table

logs.setup(snakemake.log[0])
wildcards, params = snakemake.wildcards, snakemake.params
if rule == "stage_eval_tasks":
    run.stage_tasks(
        wildcards.experiment,
        params.tasks,
        params.tasks_dir,
        os.environ.get("HPCLLM_HF_MIRROR"),
        online=params.online,
        site=params.site,
        facts=params.facts,
        manifest=snakemake.output.manifest,
    )
elif rule == "evaluation_table":
    write_table(
        wildcards.experiment,
        snakemake.input.tasks,
        snakemake.input.perplexity,
        snakemake.input.export,
        snakemake.output[0],
    )
else:
    if rule == "evaluate_tasks":
        kwargs = dict(
            export_record=snakemake.input.export,
            manifest=snakemake.input.tasks,
            shots=params.shots,
            limit=params.limit,
            cache_dir=params.cache_dir,
        )
    else:
        kwargs = dict(
            export_record=snakemake.input.export,
            prefixes=dict(params.prefixes),
            split=params.split,
            seq_length=params.seq_length,
            max_tokens=params.max_tokens,
        )
    kwargs.update(iteration=int(wildcards.iteration), output=snakemake.output[0])
    if params.container:
        run.in_container(params.cluster, params.container, rule, kwargs)
    else:
        getattr(run, rule)(**kwargs)
