import hpcllm_checkout  # noqa: F401  (hpcllm from the checkout that planned the run)

from hpcllm.offline import go_offline

go_offline()  # a compute job: no Hugging Face hub lookups (docs/clusters.md)

from hpcllm import logs
from hpcllm.bench.hold import hold_if_failed_below
from hpcllm.bench.language import run_language_point
from hpcllm.clusters import load_cluster

logs.setup(snakemake.log[0])
point = snakemake.params.point
# A smaller point of the series failed in the network or at start-up: held, not run.
if hold_if_failed_below(point, snakemake.output.log, snakemake.output.record) is None:
    run_language_point(
        point,
        snakemake.output.log,
        snakemake.output.record,
        load_cluster(point["cluster"]),
        container=snakemake.params.container,
        time_limit_s=snakemake.params.time_limit_s,
    )
