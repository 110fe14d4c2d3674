import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm.offline import go_offline

go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)

from hpcllm import logs
from hpcllm.evaluation import run

logs.setup(snakemake.log[0])
rule, wildcards, params = snakemake.rule, snakemake.wildcards, snakemake.params
if rule == "evaluate_tasks":
    kwargs = dict(
        export_record=snakemake.input.export,
        manifest=snakemake.input.tasks,
        shots=params.shots,
        limit=params.limit,
        cache_dir=params.cache_dir,
    )
else:  # evaluate_perplexity
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
