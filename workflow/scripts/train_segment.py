import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm.offline import go_offline

go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)

from hpcllm import logs
from hpcllm.training.campaign.attempts import excluded_nodes
from hpcllm.training.campaign.segment import run_segment
from hpcllm.training.plan.experiment import Paths, as_measured

logs.setup(snakemake.log.main)
experiment = snakemake.wildcards.experiment
run_segment(
    experiment,
    # layout: auto: the measuring job's choice (planned before it ran: again)
    as_measured(experiment, snakemake.params.prepared, snakemake.config, snakemake.params.cluster),
    int(snakemake.wildcards.k),
    Paths(
        save=snakemake.params.save,
        record=snakemake.output.record,
        engine_log=snakemake.params.engine_log,
        data_cache=snakemake.params.index_cache,
        tensorboard=f"{snakemake.params.save}/tensorboard",
    ),
    snakemake.params.cluster,
    container=snakemake.input.container[0] if snakemake.input.container else None,
    attempt=snakemake.resources.attempt,
    # the nodes a retry after a hang asked Slurm to avoid (segment_slurm_extra)
    excluded=excluded_nodes(snakemake.resources.get("slurm_extra", "")),
)
